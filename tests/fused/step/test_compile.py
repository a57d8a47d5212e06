"""compile=True: the vmapped training step under torch.compile equals eager; what cannot compile runs eagerly."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
from torch import nn

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends import make_backend
from lightning_hydro.backends.compile_check import CHECKED_CALLS
from lightning_hydro.demos import DigitsMLP
from lightning_hydro.stacking.stacked_state import StackedState
from tests.helpers import fit_digits, make_trainer, max_state_difference, seeded


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(32, 64, generator=generator), torch.randint(0, 10, (32,), generator=generator)


def _first_step_gradients(backend: str, compile: bool, module: type[DigitsMLP] = DigitsMLP) -> dict[str, torch.Tensor]:
    trials = [seeded(lambda: module(hidden_dim=32), [i])[0] for i in range(4)]
    group = StackedState(nn.Module(), trials, list(range(4)))
    out = make_backend(backend, group, compile=compile).run("training_step", _batch(), 0)
    loss = out.loss()
    assert loss is not None
    loss.sum().backward()
    return {name: p.grad.clone() for name, p in group.params.items() if p.grad is not None}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["vmap", "hfta"])
def test_compiled_first_step_gradients_equal_eager_within_fp32_rounding(backend):
    eager = _first_step_gradients(backend, compile=False)
    compiled = _first_step_gradients(backend, compile=True)
    assert eager.keys() == compiled.keys()
    for name, g in eager.items():
        assert (compiled[name] - g).norm() / g.norm() <= 1e-5, name


@pytest.mark.slow
def test_a_compiled_fit_trains_each_trial_like_the_eager_fit():
    def fit(compile: bool) -> FusedLightningModule:
        trials = [seeded(lambda lr=lr: DigitsMLP(hidden_dim=32, lr=lr), [i])[0] for i, lr in enumerate([0.05, 0.1])]
        fused = FusedLightningModule(trials, backend="vmap", compile=compile, summary=False)
        fit_digits(make_trainer(max_steps=10, limit_val_batches=0), fused)
        return fused

    eager, compiled = fit(False), fit(True)
    for tid in (0, 1):
        assert compiled.results[tid]["steps"] == eager.results[tid]["steps"] == 10
        assert max_state_difference(compiled.unfuse(tid), eager.unfuse(tid)) <= 1e-5


def _accumulating_fit(compile: bool, steps: int = 8, **trials: Any) -> FusedLightningModule:
    """2 digits MLPs, gradients accumulated over 2 batches: the split step all along (no whole step)."""
    lrs = [0.05, 0.1]
    modules = [seeded(lambda lr=lr: DigitsMLP(hidden_dim=32, lr=lr, **trials), [i])[0] for i, lr in enumerate(lrs)]
    fused = FusedLightningModule(modules, backend="vmap", compile=compile, summary=False)
    fit_digits(make_trainer(max_steps=steps, limit_val_batches=0, accumulate_grad_batches=2), fused)
    return fused


def test_the_split_steps_first_compiled_calls_are_checked_against_the_eager_one():
    compiled = _accumulating_fit(True)
    step = compiled._training_step.policy.backend.compiled_step
    assert step is not None
    # the first training calls (the first batch's verification runs eagerly: eval mode, full precision)
    assert step.checks == CHECKED_CALLS == 3
    assert (step.unchecked, step.failure) == ("", "")
    assert step.worst <= 1e-2
    assert compiled._training_step.whole.reason.startswith("gradients are accumulated")


@pytest.mark.parametrize("wrong_from", [1, 3])
def test_a_compiled_forward_that_computes_otherwise_is_found_at_a_checked_call_and_runs_eagerly(
    wrong_from, monkeypatch, caplog
):
    # a miscompiled forward and backward (here: a loss 1.5x too large, so gradients 1.5x too) in a fit that never
    # runs whole: the split step's first compiled calls are checked against the eager one, and the eager result kept;
    # wrong from the third call on, it is found at the third check
    from lightning_hydro.backends import compiled_step

    class Miscompiled:
        def __init__(self, function: Any, mode: Any, where: str) -> None:
            self.function, self.calls = function, 0

        def __call__(self, *args: Any) -> Any:
            self.calls += 1
            encoded, *rest = self.function(*args)
            return (encoded * 1.5 if self.calls >= wrong_from else encoded, *rest)

    eager = _accumulating_fit(False)
    monkeypatch.setattr(compiled_step, "StepCompiler", Miscompiled)
    with caplog.at_level(logging.WARNING, logger="lightning_hydro"):
        compiled = _accumulating_fit(True)
    step = compiled._training_step.policy.backend.compiled_step
    assert step is not None
    assert step.checks == wrong_from  # found at the first wrong call, eager from then on
    assert step.failure == step.mismatch
    said = f"its compiled call (check {wrong_from} of 3) computed otherwise than the eager one on cpu"
    assert step.mismatch.startswith(said)
    assert len([r for r in caplog.records if "falls back to eager" in r.getMessage()]) == 1
    for tid in (0, 1):
        assert max_state_difference(compiled.unfuse(tid), eager.unfuse(tid)) <= 1e-6


def test_a_compiled_forward_that_draws_random_numbers_is_not_compared(caplog):
    with caplog.at_level(logging.INFO, logger="lightning_hydro"):
        compiled = _accumulating_fit(True, dropout=0.3)
    step = compiled._training_step.policy.backend.compiled_step
    assert step is not None
    assert step.checks == 3
    assert step.unchecked.startswith("the step draws random numbers")
    assert step.failure == ""
    assert len([r for r in caplog.records if "the step draws random numbers" in r.getMessage()]) == 1  # said once


class PrintingMLP(DigitsMLP):
    """Its step prints: torch.compile cannot keep that in one graph."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        print(end="")
        return super().training_step(batch, batch_idx)


def test_a_step_that_cannot_compile_runs_eagerly_with_one_log_line(caplog):
    eager = _first_step_gradients("vmap", compile=False, module=PrintingMLP)
    trials = [seeded(lambda: PrintingMLP(hidden_dim=32), [i])[0] for i in range(4)]
    group = StackedState(nn.Module(), trials, list(range(4)))
    backend = make_backend("vmap", group, compile=True)
    with caplog.at_level(logging.WARNING, logger="lightning_hydro"):
        for _ in range(2):
            for param in group.params.values():
                param.grad = None
            out = backend.run("training_step", _batch(), 0)
            loss = out.loss()
            assert loss is not None
            loss.sum().backward()
    lines = [r.getMessage() for r in caplog.records if "falls back to eager" in r.getMessage()]
    assert len(lines) == 1
    assert "backend='vmap', PrintingMLP.training_step" in lines[0]
    assert backend.compile_failure  # type: ignore[attr-defined]
    for name, param in group.params.items():
        assert torch.equal(param.grad, eager[name])


def test_compile_argument_is_checked():
    with pytest.raises(ValueError, match=r"compile must be False, True or 'reduce-overhead', got 'max-autotune'"):
        FusedLightningModule([DigitsMLP(hidden_dim=8)], compile="max-autotune")  # type: ignore[arg-type]


def _update_steps(compile: Any, steps: int = 3, optimizer: str = "adamw", state: bool = False) -> list[torch.Tensor]:
    """A fused update of 3 rows (AdamW, or SGD with momentum) stepped ``steps`` times on fixed gradients, row 1
    skipped; the parameters after (``state``: and the optimizer state and counters)."""
    from lightning_hydro.fused.step.select_update import select_fused_update

    generator = torch.Generator().manual_seed(0)
    stacked = [
        nn.Parameter(torch.randn(3, 4, 5, generator=generator)),
        nn.Parameter(torch.randn(3, 5, generator=generator)),
    ]
    trials = [[nn.Parameter(p.detach()[r].clone()) for p in stacked] for r in range(3)]
    if optimizer == "adamw":
        optimizers = [torch.optim.AdamW(t, lr=0.01 * (r + 1)) for r, t in enumerate(trials)]
    else:
        optimizers = [torch.optim.SGD(t, lr=0.01 * (r + 1), momentum=0.9) for r, t in enumerate(trials)]
    update = select_fused_update(optimizers, trials, stacked)
    assert not isinstance(update, str)
    update.compile(compile)
    for _ in range(steps):
        for p in stacked:
            p.grad = torch.randn(p.shape, generator=generator)
        update.step([o.param_groups for o in optimizers], skip_rows=torch.tensor([False, True, False]))
    kept = [p.detach().clone() for p in stacked]
    if state:
        kept += [t for s in update.state for t in s.values()]
        kept += [t for t in vars(update).values() if isinstance(t, torch.Tensor)]  # Adam's counts, SGD's flags
    return kept


def _fallen_back(caplog: pytest.LogCaptureFixture, **steps: Any) -> tuple[Any, str]:
    """:func:`_update_steps` under a CompiledUpdate that falls back to eager: its results equal the eager run's, and
    one log line says so. Returns the CompiledUpdate and that line."""
    from lightning_hydro.fused.step.compiled_update import CompiledUpdate

    eager = _update_steps(False, **steps)
    compiled = CompiledUpdate(True)
    with caplog.at_level(logging.WARNING, logger="lightning_hydro"):
        fallen_back = _update_steps(compiled, **steps)
    lines = [r.getMessage() for r in caplog.records if "runs the fused optimizer update eagerly" in r.getMessage()]
    assert len(lines) == 1
    for a, b in zip(eager, fallen_back, strict=True):
        assert torch.equal(a, b)
    return compiled, lines[0]


def test_a_fused_update_that_cannot_compile_runs_eagerly_with_one_log_line(monkeypatch, caplog):

    def cannot_compile(function: Any, **kwargs: Any) -> Any:
        def fails(*args: Any) -> None:
            raise torch._dynamo.exc.Unsupported("a stand-in for what dynamo cannot trace")

        return fails

    monkeypatch.setattr(torch, "compile", cannot_compile)
    compiled, line = _fallen_back(caplog)
    assert "a stand-in for what dynamo cannot trace" in line
    assert compiled.failure.startswith("Unsupported")


@pytest.mark.slow
def test_the_compiled_fused_update_gives_the_eager_numbers_and_compiles_once_per_group_size():
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from lightning_hydro.fused.step.compiled_update import CompiledUpdate

    compiled = CompiledUpdate(True)
    eager, stepped = _update_steps(False), _update_steps(compiled)
    assert compiled.failure == ""
    assert compiled.calls == 3
    for a, b in zip(eager, stepped):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)  # inductor fuses the ops: float rounding
    code = compiled._compiled._torchdynamo_orig_callable.__code__  # type: ignore[union-attr]
    assert len(_debug_get_cache_entry_list(code)) == 1
    _update_steps(compiled)  # the group's next update (after a slot change), of the same size: the same compiled code
    assert len(_debug_get_cache_entry_list(code)) == 1
    assert compiled.calls == 6


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_a_compiled_fit_runs_the_fused_update_compiled_like_the_eager_fit(optimizer):
    def fit(compile: bool) -> FusedLightningModule:
        trials = [
            seeded(lambda lr=lr: DigitsMLP(hidden_dim=32, lr=lr, optimizer=optimizer, weight_decay=0.01), [i])[0]
            for i, lr in enumerate([0.01, 0.03, 0.1])
        ]
        fused = FusedLightningModule(trials, backend="vmap", compile=compile, optimizer_path="fused", summary=False)
        fit_digits(make_trainer(max_steps=10, limit_val_batches=0, gradient_clip_val=0.5), fused)
        return fused

    eager, compiled = fit(False), fit(True)
    update = compiled._optimizers._compiled_update
    assert update is not None
    assert update.failure == ""
    assert update.calls >= 1  # the update went through torch.compile (the first, split step; then the whole step)
    for tid in range(3):
        assert max_state_difference(compiled.unfuse(tid), eager.unfuse(tid)) <= 1e-5


@pytest.mark.parametrize(
    ("kind", "settings"),
    [
        ("adam", {"amsgrad": True}),
        ("adamw", {"weight_decay": 0.1}),
        ("sgd", {"momentum": 0.9, "dampening": 0.5, "weight_decay": 0.01}),
    ],
)
def test_the_compiled_fused_update_steps_counters_corrections_and_skipped_rows_as_eager(kind, settings):
    # torch 2.11's inductor (the GPU image's torch) counted each Adam step twice and overwrote the bias corrections
    # (an in-place write fused with reads of the value before it): the compiled fit trained otherwise, silently
    from lightning_hydro.fused.step.compiled_update import CompiledUpdate
    from lightning_hydro.fused.step.select_update import select_fused_update

    def steps(compile: bool | CompiledUpdate) -> list[torch.Tensor]:
        generator = torch.Generator().manual_seed(0)
        stacked = [
            nn.Parameter(torch.randn(3, 4, 5, generator=generator)),
            nn.Parameter(torch.randn(3, 5, generator=generator)),
        ]
        trials = [[nn.Parameter(p.detach()[r].clone()) for p in stacked] for r in range(3)]
        make = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[kind]
        optimizers = [make(t, lr=0.01 * (r + 1), **settings) for r, t in enumerate(trials)]
        update = select_fused_update(optimizers, trials, stacked)
        assert not isinstance(update, str)
        update.compile(compile)
        for step in range(4):  # row 1 skipped at its first step (its counters at 0), row 0 at the third
            for p in stacked:
                p.grad = torch.randn(p.shape, generator=generator)
            update.step([o.param_groups for o in optimizers], skip_rows=torch.tensor([step == 2, step == 0, False]))
        return [p.detach().clone() for p in stacked] + [s for state in update.state for s in state.values()]

    compiled = CompiledUpdate(True)
    eager, stepped = steps(False), steps(compiled)
    assert compiled.failure == ""
    assert compiled.calls == 4
    for a, b in zip(eager, stepped, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)  # inductor fuses the ops: float rounding


def test_a_compiled_step_finds_the_non_finite_values():
    # torch 2.11's inductor folded `x * 0` to 0, so the eager NaN test `(x * 0) != 0` found none when compiled
    from lightning_hydro.fused.step.fused_update import not_finite

    values = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.0])
    expected = [False, True, True, True, False]
    assert not_finite(values).tolist() == expected
    assert torch.compile(not_finite, fullgraph=True)(values).tolist() == expected


def test_reduce_overhead_records_no_cuda_graph_for_the_pieces_of_a_split_step(monkeypatch):
    # on an H200 (torch 2.11) a split step's pieces each recorded as a CUDA graph stopped the fit: the update's graph
    # read the gradients, outputs of the backward's graph, after cudagraph trees had given their memory to a later
    # run ("accessing tensor output of CUDAGraphs that has been overwritten"); only the whole step is one graph
    real_compile = torch.compile
    update_modes: list[Any] = []

    def recording(function: Any, **kwargs: Any) -> Any:
        if "_device_step" in getattr(function, "__name__", ""):
            update_modes.append(kwargs.get("mode"))
        return real_compile(function, **kwargs)

    monkeypatch.setattr(torch, "compile", recording)
    trials = [seeded(lambda lr=lr: DigitsMLP(hidden_dim=16, lr=lr), [i])[0] for i, lr in enumerate([0.05, 0.1])]
    fused = FusedLightningModule(trials, backend="vmap", compile="reduce-overhead", summary=False)
    fit_digits(make_trainer(max_steps=3, limit_val_batches=0), fused)
    assert fused._policy.backend._compiled._compiled.mode is None  # type: ignore[union-attr]
    assert update_modes == [None]  # the split step's update (the first step)
    whole = fused._training_step.whole
    assert whole.whole_steps == 2
    assert whole._compiled.mode == "reduce-overhead"


def _miscompiling(monkeypatch: pytest.MonkeyPatch, wrong_from: int = 1) -> None:
    """torch.compile of the fused update's device work gives a step that computes otherwise: from its
    ``wrong_from``-th call on, it steps twice."""
    real_compile = torch.compile

    def compile_(function: Any, **kwargs: Any) -> Any:
        if "_device_step" not in getattr(function, "__name__", ""):
            return real_compile(function, **kwargs)
        calls = []

        def twice(update: Any, grads: Any, skip: Any, prepared: Any) -> None:
            calls.append(1)
            function(update, grads, skip, prepared)
            if len(calls) >= wrong_from:
                function(update, grads, skip, prepared)

        return twice

    monkeypatch.setattr(torch, "compile", compile_)


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_a_compiled_update_that_computes_otherwise_is_found_at_its_first_step_and_runs_eagerly(
    kind, monkeypatch, caplog
):
    # as Adam's compiled update did on CUDA (H200, torch 2.11): the first compiled steps of each update are checked
    # against the eager step from the same state, and the eager result kept

    _miscompiling(monkeypatch)
    compiled, line = _fallen_back(caplog, optimizer=kind, state=True)
    assert "computed otherwise than the eager one on cpu" in line
    assert compiled.mismatch == compiled.failure
    assert compiled.calls == 1  # the first step ran compiled (and was checked), the others eagerly


def test_a_compiled_update_that_goes_wrong_at_its_second_step_is_found_there(monkeypatch, caplog):
    # a wrong read of the state compiled code wrote shows only from the second step on: checked there too
    _miscompiling(monkeypatch, wrong_from=2)
    compiled, line = _fallen_back(caplog, optimizer="adamw", state=True)
    assert "computed otherwise than the eager one on cpu (check 2 of 3" in line
    assert compiled.calls == 2


def test_a_compiled_update_that_computes_otherwise_keeps_the_fit_off_the_whole_step(monkeypatch, caplog):
    eager_trials = [seeded(lambda lr=lr: DigitsMLP(hidden_dim=16, lr=lr), [i])[0] for i, lr in enumerate([0.05, 0.1])]
    eager = FusedLightningModule(eager_trials, backend="vmap", summary=False)
    fit_digits(make_trainer(max_steps=6, limit_val_batches=0), eager)
    _miscompiling(monkeypatch)
    trials = [seeded(lambda lr=lr: DigitsMLP(hidden_dim=16, lr=lr), [i])[0] for i, lr in enumerate([0.05, 0.1])]
    compiled = FusedLightningModule(trials, backend="vmap", compile=True, summary=False)
    with caplog.at_level(logging.INFO, logger="lightning_hydro"):
        fit_digits(make_trainer(max_steps=6, limit_val_batches=0), compiled)
    whole = compiled._training_step.whole
    assert whole.whole_steps == 0  # the whole step compiles the same device work: it is not trusted either
    assert "FusedSGDUpdate: its compiled step computed otherwise than the eager one" in whole.reason
    report = compiled.compile_report
    assert report.startswith("compile=True: 0 training steps ran whole")
    assert f"; the split step's update runs eagerly: {compiled._optimizers.compiled_update_failure}" in report
    assert "computed otherwise than the eager one" in compiled._optimizers.compiled_update_failure
    for tid in (0, 1):
        assert max_state_difference(compiled.unfuse(tid), eager.unfuse(tid)) <= 1e-5


def test_what_the_compiled_updates_check_takes_for_the_same_step():
    from lightning_hydro.backends.compile_check import mismatch

    before = torch.tensor([1.0, 2.0, float("nan"), 4.0])
    eager = torch.tensor([0.9, 2.1, float("nan"), 4.0])  # a step of 0.1 on two entries; a NaN the step left alone
    assert float(mismatch(before, eager.clone(), eager)) == 0.0
    rounding = eager + torch.tensor([1e-7, -1e-7, 0.0, 4e-7])  # float rounding of a fused, reordered step
    assert float(mismatch(before, rounding, eager)) <= 1.0
    twice = torch.tensor([0.8, 2.2, float("nan"), 4.0])  # the step taken twice
    assert float(mismatch(before, twice, eager)) > 100
    assert float(mismatch(before, torch.tensor([0.9, 2.1, 0.0, 4.0]), eager)) == float("inf")  # NaN lost
    flags = torch.tensor([True, False])
    assert float(mismatch(flags, flags.clone(), flags)) == 0.0
    assert float(mismatch(flags, ~flags, flags)) == float("inf")


def test_a_check_that_cannot_run_leaves_the_eager_result_and_the_update_eager(monkeypatch, caplog):
    from lightning_hydro.fused.step import compiled_update

    def cannot(*args: Any) -> torch.Tensor:
        raise RuntimeError("a stand-in for a device that cannot compare")

    monkeypatch.setattr(compiled_update, "mismatch", cannot)
    compiled, line = _fallen_back(caplog)
    assert compiled.mismatch.startswith("its compiled step could not be checked against the eager one")
    assert "a stand-in for a device that cannot compare" in line
    assert compiled.calls == 1
