"""The fused fast path computes what B separate torch optimizers compute, row for row."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from lightning_hydro.fused.step.fused_update import FusedAdamUpdate, FusedSGDUpdate
from lightning_hydro.fused.step.select_update import select_fused_update

ROWS = 4


def make_stacked(seed: int = 0) -> tuple[list[nn.Parameter], list[list[nn.Parameter]]]:
    g = torch.Generator().manual_seed(seed)
    stacked = [nn.Parameter(torch.randn(ROWS, 3, 5, generator=g)), nn.Parameter(torch.randn(ROWS, 5, generator=g))]
    trials = [[nn.Parameter(p.detach()[r].clone()) for p in stacked] for r in range(ROWS)]
    return stacked, trials


SGD_SETTINGS = [
    dict(lr=0.1, momentum=0.9),
    dict(lr=0.05, momentum=0.0, weight_decay=0.01),
    dict(lr=0.2, momentum=0.5, dampening=0.3, weight_decay=0.001),
    dict(lr=0.01, momentum=0.8, nesterov=True),
]
# every row with momentum and no nesterov: after the first step the foreach ("steady") update runs
STEADY_SGD_SETTINGS = [
    dict(lr=0.1, momentum=0.9),
    dict(lr=0.05, momentum=0.5, weight_decay=0.01),
    dict(lr=0.2, momentum=0.3, dampening=0.3, weight_decay=0.001),
    dict(lr=0.01, momentum=0.99, dampening=0.1),
]
ADAM_SETTINGS = [
    dict(lr=1e-2),
    dict(lr=3e-3, betas=(0.8, 0.99), weight_decay=0.01),
    dict(lr=1e-3, eps=1e-6),
    dict(lr=5e-2, betas=(0.95, 0.9), weight_decay=0.1),
]


def run(
    kind: str,
    settings: list[dict[str, Any]],
    steps: int,
    skip: dict[int, list[int]] | None = None,
    read: bool = False,
    schedule: Callable[[int, list[torch.optim.Optimizer]], None] | None = None,
    **common: Any,
):
    """Train the stacked rows with the fused update and each row's copy with torch; return both.

    ``read``: the update may read its skip mask back (the CPU's default), and leaves the masking out of clean steps.
    ``schedule(step, optimizers)``: changes the optimizers' hyperparameters before a step, as a scheduler does.
    """
    stacked, trials = make_stacked()
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[kind]
    optimizers = [cls(params, **s, **common) for params, s in zip(trials, settings)]
    fused = select_fused_update(optimizers, trials, stacked)
    assert not isinstance(fused, str), fused
    for step in range(steps):
        if schedule is not None:
            schedule(step, optimizers)
        g = torch.Generator().manual_seed(100 + step)
        grads = [torch.randn(p.shape, generator=g) for p in stacked]
        skipped = (skip or {}).get(step, [])
        for p, grad in zip(stacked, grads):
            p.grad = grad.clone()
        fused.step([o.param_groups for o in optimizers], skip_rows=skipped, read=read)
        for row, (params, opt) in enumerate(zip(trials, optimizers)):
            if row in skipped:
                continue
            for p, grad in zip(params, grads):
                p.grad = grad[row].clone()
            opt.step()
    return fused, stacked, trials, optimizers


@pytest.mark.parametrize("read", [False, True], ids=["masked", "read"])
@pytest.mark.parametrize(
    ("kind", "settings"),
    [("sgd", SGD_SETTINGS), ("sgd", STEADY_SGD_SETTINGS), ("adam", ADAM_SETTINGS), ("adamw", ADAM_SETTINGS)],
)
def test_rows_match_separate_torch_optimizers(kind, settings, read):
    _fused, stacked, trials, _ = run(kind, settings, steps=10, read=read)
    for row, params in enumerate(trials):
        for p_fused, p_own in zip(stacked, params):
            torch.testing.assert_close(p_fused.detach()[row], p_own.detach(), rtol=1e-6, atol=1e-7)


def test_amsgrad_matches():
    fused, stacked, trials, _ = run("adam", ADAM_SETTINGS, steps=6, amsgrad=True)
    assert isinstance(fused, FusedAdamUpdate)
    assert fused.amsgrad
    for row, params in enumerate(trials):
        torch.testing.assert_close(stacked[0].detach()[row], params[0].detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("read", [False, True], ids=["masked", "read"])
@pytest.mark.parametrize(
    ("kind", "settings"), [("sgd", SGD_SETTINGS), ("sgd", STEADY_SGD_SETTINGS), ("adam", ADAM_SETTINGS)]
)
def test_skipped_rows_keep_parameters_and_state(kind, settings, read):
    # row 1 is skipped at steps 0 and 3 (a diverged trial would be); it must look as if those steps never came.
    # read: the clean steps between leave the masking out, and must first restore the rows' own factors
    _fused, stacked, trials, _ = run(kind, settings, steps=6, skip={0: [1], 3: [1, 2]}, read=read)
    for row, params in enumerate(trials):
        for p_fused, p_own in zip(stacked, params):
            torch.testing.assert_close(p_fused.detach()[row], p_own.detach(), rtol=1e-6, atol=1e-7)


def _steady_sgd(read: bool) -> tuple[FusedSGDUpdate, list[nn.Parameter], list[torch.optim.Optimizer]]:
    stacked, trials = make_stacked()
    optimizers = [torch.optim.SGD(params, **s) for params, s in zip(trials, STEADY_SGD_SETTINGS)]
    fused = select_fused_update(optimizers, trials, stacked)
    assert isinstance(fused, FusedSGDUpdate)
    return fused, stacked, optimizers


def _step(fused: FusedSGDUpdate, stacked: list[nn.Parameter], optimizers: list, read: bool, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in stacked:
        p.grad = torch.randn(p.shape, generator=g)
    fused.step([o.param_groups for o in optimizers], read=read)


def test_a_clean_read_step_writes_neither_the_gradients_nor_the_factors_table():
    fused, stacked, optimizers = _steady_sgd(read=True)
    for seed in range(2):  # the first steps start the momentum buffers (a step-dependent table)
        _step(fused, stacked, optimizers, read=True, seed=seed)
    factors = fused._factors
    assert factors is not None
    table_version = factors.table._version
    g = torch.Generator().manual_seed(7)
    for p in stacked:
        p.grad = torch.randn(p.shape, generator=g)
    grad_versions = [p.grad._version for p in stacked]
    fused.step([o.param_groups for o in optimizers], read=True)
    assert [p.grad._version for p in stacked] == grad_versions  # no masked_fill_
    assert factors.table._version == table_version  # no store: it holds every row's own factors
    fused.step([o.param_groups for o in optimizers], read=False)
    assert [p.grad._version for p in stacked] != grad_versions  # the masked step zeroes skipped rows in place
    assert factors.table._version != table_version


def test_a_clean_read_step_rewrites_the_table_after_a_change_or_a_write_elsewhere():
    results = []
    for read in (False, True):
        fused, stacked, optimizers = _steady_sgd(read)
        for step in range(8):
            if step == 3:  # a scheduler's new lr: copied into the base factors
                optimizers[2].param_groups[0]["lr"] = 0.5
            if step == 5 and read:  # something else wrote the table (e.g. a compiled step's store): zeros
                factors = fused._factors
                assert factors is not None
                torch._foreach_copy_([factors.table], [torch.zeros_like(factors.table)])
            _step(fused, stacked, optimizers, read=read, seed=step)
        results.append([p.detach().clone() for p in stacked])
    for masked, read_back in zip(*results):
        assert torch.equal(masked, read_back)  # bitwise: the same arithmetic, only the masking left out


@pytest.mark.parametrize(("kind", "settings"), [("sgd", SGD_SETTINGS), ("adam", ADAM_SETTINGS)])
def test_state_round_trips_through_torchs_format(kind, settings):
    fused, stacked, trials, optimizers = run(kind, settings, steps=3)
    for row, (params, opt) in enumerate(zip(trials, optimizers)):
        exported = fused.export_row(row)
        own = [opt.state[p] for p in params]
        for mine, theirs in zip(exported, own):
            assert mine.keys() == {k for k in theirs if theirs[k] is not None}
            for key in mine:
                torch.testing.assert_close(mine[key].float(), theirs[key].float(), rtol=1e-6, atol=1e-7)
    clone = type(fused)(stacked) if kind == "sgd" else FusedAdamUpdate(stacked)
    for row in range(ROWS):
        clone.import_row(row, fused.export_row(row))
    for row in range(ROWS):
        for a, b in zip(clone.export_row(row), fused.export_row(row)):
            assert a.keys() == b.keys()


def _momentum_goes_to_zero_and_back(step: int, optimizers: list[torch.optim.Optimizer]) -> None:
    """Row 0: 0.9, then 0 for steps 3-4, then 0.9 (OneCycleLR/CyclicLR cycle momentum down to a base of 0 so). Row 2:
    no momentum until step 4, then 0.5 with dampening 0.5. Rows 1 and 3 keep theirs."""
    optimizers[0].param_groups[0]["momentum"] = 0.0 if step in (3, 4) else 0.9
    optimizers[2].param_groups[0]["momentum"] = 0.5 if step >= 4 else 0.0


@pytest.mark.parametrize("read", [False, True], ids=["masked", "read"])
def test_a_rows_momentum_that_is_zero_for_some_steps_updates_as_torchs(read):
    """Before: a row with momentum 0 beside rows with momentum had its buffer zeroed (buf * momentum), and a row that
    turned momentum on late started its buffer as (1 - dampening) * grad, not torch's grad (weights 6e-2 to 0.24
    relative from alone in a fit)."""
    settings = [
        dict(lr=0.1, momentum=0.9),
        dict(lr=0.05, momentum=0.9),
        dict(lr=0.2, momentum=0.0, dampening=0.5),
        dict(lr=0.01, momentum=0.8, dampening=0.1),
    ]
    _fused, stacked, trials, _ = run("sgd", settings, steps=9, read=read, schedule=_momentum_goes_to_zero_and_back)
    for row, params in enumerate(trials):
        for p_fused, p_own in zip(stacked, params):
            torch.testing.assert_close(p_fused.detach()[row], p_own.detach(), rtol=1e-6, atol=1e-7)


def test_momentum_zero_rows_keep_no_buffer():
    fused, _, _, _optimizers = run("sgd", SGD_SETTINGS, steps=2)
    assert isinstance(fused, FusedSGDUpdate)
    assert fused.export_row(1) == [{}, {}]  # momentum 0: torch keeps no buffer either
    assert "momentum_buffer" in fused.export_row(0)[0]


def test_select_explains_why_the_fast_path_is_unavailable():
    stacked, trials = make_stacked()
    mixed = [torch.optim.SGD(trials[0], lr=0.1), torch.optim.Adam(trials[1], lr=0.1)]
    assert select_fused_update(mixed, trials[:2], stacked) == "the trials use different optimizer classes (Adam, SGD)"
    rms = [torch.optim.RMSprop(t, lr=0.1) for t in trials]
    assert "RMSprop has no fused implementation" in select_fused_update(rms, trials, stacked)
    regrouped = [
        torch.optim.SGD([{"params": t[: 1 + i % 2]}, {"params": t[1 + i % 2 :]}], lr=0.1) for i, t in enumerate(trials)
    ]
    assert (
        select_fused_update(regrouped, trials, stacked) == "the trials' optimizers group their parameters differently"
    )
    foreign = [torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1) for _ in trials]
    assert select_fused_update(foreign, trials, stacked) == "an optimizer holds parameters outside the trial"
    maximize = [torch.optim.SGD(t, lr=0.1, maximize=True) for t in trials]
    assert select_fused_update(maximize, trials, stacked) == "maximize=True or differentiable=True"
    ams = [torch.optim.Adam(t, lr=0.1, amsgrad=i == 0) for i, t in enumerate(trials)]
    assert select_fused_update(ams, trials, stacked) == "the trials differ in amsgrad or decoupled weight decay"


def test_several_param_groups_with_per_group_hyperparameters():
    """muP surrogates split parameters into groups with their own learning rates: still one fused update."""
    stacked, trials = make_stacked()
    optimizers = [
        torch.optim.SGD([{"params": t[:1], "lr": 0.1 * (r + 1)}, {"params": t[1:], "lr": 0.01}], lr=1.0, momentum=0.9)
        for r, t in enumerate(trials)
    ]
    fused = select_fused_update(optimizers, trials, stacked)
    assert isinstance(fused, FusedSGDUpdate)
    assert fused.group_of == [0, 1]
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        grads = [torch.randn(p.shape, generator=g) for p in stacked]
        for p, grad in zip(stacked, grads):
            p.grad = grad.clone()
        fused.step([o.param_groups for o in optimizers])
        for row, (params, opt) in enumerate(zip(trials, optimizers)):
            for p, grad in zip(params, grads):
                p.grad = grad[row].clone()
            opt.step()
    for row, params in enumerate(trials):
        for p_fused, p_own in zip(stacked, params):
            torch.testing.assert_close(p_fused.detach()[row], p_own.detach(), rtol=1e-6, atol=1e-7)


def test_parameters_outside_every_group_are_not_updated():
    stacked, trials = make_stacked()
    optimizers = [torch.optim.Adam(t[:1], lr=0.1) for t in trials]  # the bias-like parameter is frozen
    fused = select_fused_update(optimizers, trials, stacked)
    assert isinstance(fused, FusedAdamUpdate)
    before = stacked[1].detach().clone()
    for p in stacked:
        p.grad = torch.ones_like(p)
    fused.step([o.param_groups for o in optimizers])
    assert torch.equal(stacked[1].detach(), before)


def test_a_read_step_whose_gradient_total_overflows_still_steps_every_finite_row():
    # rows' sums finite (3e38 each), their total not: the read finds no proof of a clean step and takes the masked
    # way, which finds no bad row; every row steps as torch's SGD steps it
    stacked, trials = make_stacked()
    optimizers = [torch.optim.SGD(params, lr=1e-39) for params in trials]
    fused = select_fused_update(optimizers, trials, stacked)
    assert isinstance(fused, FusedSGDUpdate)
    grads = [torch.zeros(p.shape) for p in stacked]
    grads[1][:, 0] = 3e38
    for p, grad in zip(stacked, grads):
        p.grad = grad.clone()
    bad, skipped = fused.step([o.param_groups for o in optimizers], read=True)
    assert not bad.any()
    assert not skipped.any()
    for row, (params, opt) in enumerate(zip(trials, optimizers)):
        for p, grad in zip(params, grads):
            p.grad = grad[row].clone()
        opt.step()
        for p_fused, p_own in zip(stacked, params):
            assert torch.equal(p_fused.detach()[row], p_own.detach())


@pytest.mark.parametrize("clip", [False, True], ids=["plain", "clipped"])
def test_large_finite_float16_gradients_are_not_taken_for_a_divergence(clip):
    # each row's gradients sum to 3e6 and their norm is 94900: past float16's 65504, finite all the same. Every row
    # steps as torch's SGD steps it; clipped, as clip_grad_norm_ clips it (its float16 norm is inf: a factor of 0)
    torch.manual_seed(0)
    stacked = [nn.Parameter(torch.randn(2, 1000).half()), nn.Parameter(torch.randn(2, 10).half())]
    trials = [[nn.Parameter(p.detach()[r].clone()) for p in stacked] for r in range(2)]
    optimizers = [torch.optim.SGD(params, lr=1e-3, momentum=0.9) for params in trials]
    fused = select_fused_update(optimizers, trials, stacked)
    assert isinstance(fused, FusedSGDUpdate)
    grads = [torch.full(p.shape, 3000.0, dtype=torch.float16) for p in stacked]
    for read in (False, True):
        for p, grad in zip(stacked, grads):
            p.grad = grad.clone()
        if clip:
            fused.clip_norm(1.0)
        bad, skipped = fused.step([o.param_groups for o in optimizers], read=read)
        assert not bad.any()
        assert not skipped.any()
        for params, opt in zip(trials, optimizers):
            for p, grad in zip(params, grads):
                p.grad = grad[0].clone()
            if clip:
                torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
    for row, params in enumerate(trials):
        for p_fused, p_own in zip(stacked, params):
            torch.testing.assert_close(p_fused.detach()[row], p_own.detach(), rtol=1e-3, atol=1e-3)
