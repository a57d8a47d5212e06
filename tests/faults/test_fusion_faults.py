"""Fault injection for fusion: a fault is either refused with its reason or stays inside its own trial.

Each test injects one fault that used to be silently wrong, crash, or raise a false alarm, and checks the
outcome on every backend it concerns.
"""

from __future__ import annotations

import copy
import logging
import warnings
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from lightning_hydro import FusedLightningModule, FusionError, FusionMismatchError
from lightning_hydro.backends import make_backend
from lightning_hydro.backends.base import StepOutputs
from lightning_hydro.backends.vmap_backend import VmapBackend
from lightning_hydro.demos import DigitsMLP
from lightning_hydro.demos.digits import load_digits_tensors
from lightning_hydro.fused.verify.fusion import compare, verify_fusion
from lightning_hydro.stacking import StackedState
from tests.helpers import (
    fit_digits,
    make_trainer,
    max_state_difference,
    mixed_optimizer_mlps,
    seeded,
    train_fused,
    train_separately,
)

# -- a scheduler on the fused optimizer path: no false "lr_scheduler.step() before optimizer.step()" ----------


class WarmupMLP(DigitsMLP):
    """A linear learning-rate warm-up stepped every optimizer step, the usual transformer recipe."""

    def configure_optimizers(self) -> Any:
        optimizer = super().configure_optimizers()
        warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 5))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}


def _scheduler_warnings(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "lr_scheduler.step()" in str(w.message)]


@pytest.mark.parametrize("optimizer_path", ["fused", "universal"])
def test_a_scheduled_fused_run_warns_of_no_skipped_schedule_and_follows_it(optimizer_path):
    trials = [seeded(lambda lr=lr: WarmupMLP(hidden_dim=16, lr=lr), [i])[0] for i, lr in enumerate([0.05, 0.2])]
    separate = train_separately(trials, fit_digits, max_steps=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fused = train_fused(
            trials, fit_digits, fused_kwargs={"backend": "vmap", "optimizer_path": optimizer_path}, max_steps=8
        )
    assert fused._optimizer is not None
    assert fused._optimizer.active_path == optimizer_path
    assert _scheduler_warnings(caught) == []
    for tid, module in enumerate(separate):
        own = fused._optimizer.trials[tid]
        assert own.optimizer.param_groups[0]["lr"] == module.trainer.optimizers[0].param_groups[0]["lr"]
        assert max_state_difference(fused.unfuse(tid), module) <= 1e-6


def test_torch_still_warns_when_a_trials_scheduler_really_steps_before_any_update():
    fused = FusedLightningModule([WarmupMLP(hidden_dim=8), WarmupMLP(hidden_dim=8)], backend="vmap", summary=False)
    _, schedulers = fused.configure_optimizers()
    with pytest.warns(UserWarning, match=r"Detected call of `lr_scheduler.step\(\)` before `optimizer.step\(\)`"):
        schedulers[0]["scheduler"].step()


# -- an ordinary error under vmap: auto falls back to loop and says why; an explicit vmap names the line ------


class RunningLogitsMLP(DigitsMLP):
    """Keeps a running sum of its logits in a plain tensor attribute (not a registered buffer)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.logit_sum = torch.zeros(32, 10)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        # one tensor shared by all trials, per-trial values: fails under vmap
        self.logit_sum += logits.detach()
        return F.cross_entropy(logits, y)


def _fit_batches_of_32(trainer: L.Trainer, module: L.LightningModule) -> None:
    fit_digits(trainer, module, batch_size=32)


def test_auto_falls_back_to_loop_when_vmap_fails_with_an_ordinary_error():
    trials = [seeded(lambda lr=lr: RunningLogitsMLP(hidden_dim=8, lr=lr), [i])[0] for i, lr in enumerate([0.05, 0.2])]
    separate = train_separately(trials, _fit_batches_of_32, max_steps=3)
    fused = train_fused(trials, _fit_batches_of_32, fused_kwargs={"backend": "auto"}, max_steps=3)
    assert fused.backend == "loop"
    assert (
        f"vmap skipped: backend='vmap' failed in RunningLogitsMLP.training_step at {__file__}" in fused.backend_report
    )
    for tid, module in enumerate(separate):
        assert max_state_difference(fused.unfuse(tid), module) <= 1e-6


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
def test_an_explicit_fused_backend_names_the_failing_line_and_suggests_loop(backend):
    fused = FusedLightningModule([RunningLogitsMLP(hidden_dim=8) for _ in range(2)], backend=backend, summary=False)
    with pytest.raises(
        FusionError,
        match=rf"backend='{backend}' failed in RunningLogitsMLP.training_step at .*test_fusion_faults.py:\d+ in "
        r"training_step: self.logit_sum \+= logits.detach\(\): RuntimeError: output with shape \[32, 10\] doesn't "
        r"match the broadcast shape \[2, 32, 10\].*Use backend='loop'",
    ):
        _fit_batches_of_32(make_trainer(max_steps=1), fused)


# -- a Python attribute that differs between trials and that the step reads: refused, never silently wrong ----


class NanStepMLP(DigitsMLP):
    """Its loss turns NaN from step ``nan_step`` on: a fault that only some trials of the group carry."""

    def __init__(self, nan_step: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.nan_step = nan_step

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        if self.nan_step is not None and self.global_step >= self.nan_step:
            loss = loss * float("nan")
        return loss


def _nan_step_trials() -> list[L.LightningModule]:
    return [seeded(lambda s=s: NanStepMLP(nan_step=s, hidden_dim=16), [i])[0] for i, s in enumerate([None, 20])]


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
def test_an_explicit_fused_backend_refuses_trials_whose_step_reads_a_differing_attribute(backend):
    with pytest.raises(
        FusionMismatchError,
        match=rf"backend='{backend}' cannot fuse these NanStepMLP trials: .*reads Python values that differ "
        r"between trials: nan_step \(trial 0: None, trial 1: 20\)\. .*Use backend='loop'",
    ):
        FusedLightningModule(_nan_step_trials(), backend=backend, summary=False)


def test_auto_runs_trials_whose_step_reads_a_differing_attribute_on_the_loop():
    trials = _nan_step_trials()
    separate = train_separately(trials[:1], fit_digits, max_steps=25)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": "auto"}, max_steps=25)
    assert fused.backend == "loop"
    assert "vmap skipped: backend='vmap' cannot fuse these NanStepMLP trials" in fused.backend_report
    assert fused.results[1]["status"] == "diverged"  # under vmap it was 'completed', with trial 0's nan_step
    assert fused.results[1]["steps"] == 20
    assert fused.results[0]["status"] == "completed"
    assert max_state_difference(fused.unfuse(0), separate[0]) <= 1e-6


class HparamsNanStepMLP(DigitsMLP):
    """The same fault, read from the saved hyperparameters."""

    def __init__(self, nan_step: int = 10**9, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.save_hyperparameters()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.global_step >= self.hparams["nan_step"] else loss


def test_a_differing_hyperparameter_the_step_reads_is_refused():
    with pytest.raises(FusionMismatchError, match=r"hparams.nan_step \(trial 0: 1000000000, trial 1: 20\)"):
        FusedLightningModule([HparamsNanStepMLP(), HparamsNanStepMLP(nan_step=20)], backend="vmap")


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
def test_hyperparameters_only_the_optimizer_reads_still_fuse(backend):
    trials = mixed_optimizer_mlps(hidden_dim=8)  # lr, momentum, weight decay and optimizer class differ
    fused = FusedLightningModule(trials, backend=backend, summary=False)
    assert fused.backend == backend


def test_vmap_refuses_a_differing_dropout_probability_that_hfta_runs_per_trial():
    trials = [DigitsMLP(hidden_dim=8, dropout=p) for p in (0.1, 0.5)]
    with pytest.raises(FusionMismatchError, match=r"body.2.p \(trial 0: 0.1, trial 1: 0.5\)"):
        FusedLightningModule(trials, backend="vmap")
    assert FusedLightningModule(trials, backend="hfta").backend == "hfta"


def test_a_newcomer_whose_step_would_read_a_differing_attribute_is_refused():
    fused = FusedLightningModule(
        [NanStepMLP(hidden_dim=8), NanStepMLP(hidden_dim=8)], backend="vmap", max_slots=3, summary=False
    )
    with pytest.raises(FusionMismatchError, match=r"nan_step \(trial 0: None, trial 1: None, trial 2: 3\)"):
        fused.add_trial(NanStepMLP(nan_step=3, hidden_dim=8))
    assert fused.trial_ids == [0, 1]
    assert fused.stacked.get_parameter("head__weight").shape[0] == 2


# -- the first-batch check: its tolerance follows float rounding, and its message shows the numbers ------------


def test_a_difference_at_the_measured_float_rounding_level_is_not_a_mismatch():
    own = torch.linspace(-1, 1, 1000)
    reference = own.double() + 1e-3 * torch.linspace(1, -1, 1000).double()  # an ill-conditioned value
    fused = own + 2e-3 * torch.linspace(-1, 1, 1000)  # beyond the old fixed 1e-3, within the rounding
    assert not compare("gradient", fused, own, reference, reduction=64).differs
    assert compare("gradient", own * 1.01, own, own.double(), reduction=64).differs
    assert compare("loss", torch.tensor(float("nan")), torch.tensor(1.0), None, reduction=64).differs
    inf = torch.tensor(float("inf"))
    assert not compare("loss", inf, inf, None, reduction=64).differs  # diverged in both: isolation's business


def test_a_wide_deep_mlp_whose_trials_differ_only_in_lr_passes_the_check():
    trials = [DigitsMLP(hidden_dim=1024, depth=4, lr=lr) for lr in (0.01, 0.03, 0.1, 0.3)]
    fused = FusedLightningModule(trials, backend="vmap", summary=False)
    fit_digits(make_trainer(max_steps=1), fused)
    assert fused.results[3]["steps"] == 1


class LossConfig:
    """A plain object of the user's own class (not a dataclass or a config: those the scan opens and compares)."""

    def __init__(self, smoothing: float) -> None:
        self.smoothing = smoothing


class ConfiguredMLP(DigitsMLP):
    """Label smoothing kept in an object of the user's own class: state the attribute scan cannot compare."""

    def __init__(self, smoothing: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.loss_config = LossConfig(smoothing)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y, label_smoothing=self.loss_config.smoothing)


def test_a_mismatch_the_scan_cannot_see_is_caught_with_its_numbers_and_suspects():
    fused = FusedLightningModule([ConfiguredMLP(0.0, hidden_dim=8), ConfiguredMLP(0.3, hidden_dim=8)], backend="vmap")
    with pytest.raises(
        FusionMismatchError,
        match=r"trial 1's fused training_step differs from its own module's beyond float rounding: .*"
        r"\|fused - own\| = \S+ > tolerance \S+ \(16 x max\(float32 rounding \S+, eps\*sqrt\(n\)\*\|own\| = .*"
        r"suspects: loss_config \(LossConfig\).*Not suspects .*: hparams.smoothing.*Use backend='loop'",
    ):
        fit_digits(make_trainer(max_steps=1), fused)


# -- a diverging trial leaves the others bitwise unchanged, on every backend ---------------------------------


class FaultyMLP(DigitsMLP):
    """Its loss turns NaN from step ``fault_step`` on; the step is a buffer, so each trial has its own."""

    def __init__(self, fault_step: float = float("inf"), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.register_buffer("fault_step", torch.tensor(float(fault_step)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        broken = self.fault_step <= self.global_step
        return loss * torch.where(broken, torch.tensor(float("nan")), torch.tensor(1.0))


class StopAt(L.Callback):
    def __init__(self, trial_id: int, batch_idx: int) -> None:
        self.trial_id, self.batch_idx = trial_id, batch_idx

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.batch_idx:
            pl_module.stop_trial(self.trial_id, "reference")


@pytest.mark.parametrize("backend", ["vmap", "hfta", "loop"])
def test_a_diverging_trial_leaves_the_others_bitwise_unchanged(backend):
    def group(fault_step: float) -> list[L.LightningModule]:
        steps = [float("inf"), fault_step, float("inf")]
        return [seeded(lambda s=s: FaultyMLP(s, hidden_dim=16, lr=0.1), [i])[0] for i, s in enumerate(steps)]

    faulty = train_fused(group(5), fit_digits, fused_kwargs={"backend": backend}, max_steps=12)
    # the same group, healthy, with trial 1 taken out at the same step: what the others must see
    reference = train_fused(
        group(float("inf")), fit_digits, fused_kwargs={"backend": backend}, max_steps=12, callbacks=[StopAt(1, 5)]
    )
    assert faulty.results[1]["status"] == "diverged"
    assert faulty.results[1]["steps"] == 5
    assert all(torch.isfinite(p).all() for p in faulty.unfuse(1).parameters())  # its last finite weights
    for tid in (0, 2):
        assert faulty.results[tid]["steps"] == 12
        for (name, a), b in zip(faulty.unfuse(tid).state_dict().items(), reference.unfuse(tid).state_dict().values()):
            assert torch.equal(a, b), (backend, tid, name)


def test_under_auto_a_failed_first_batch_check_moves_the_group_to_the_loop():
    trials = [seeded(lambda s=s: ConfiguredMLP(s, hidden_dim=8), [i])[0] for i, s in enumerate([0.0, 0.3])]
    separate = train_separately(trials, fit_digits, max_steps=3)
    fused = FusedLightningModule([copy.deepcopy(t) for t in trials], backend="auto", summary=False)
    fused._policy.backend = make_backend("vmap", fused._group)  # as if auto's timing had chosen vmap
    torch.manual_seed(1234)
    with pytest.warns(
        UserWarning, match=r"backend='auto' runs the group on 'loop' from now on: .*suspects: loss_config"
    ):
        fit_digits(make_trainer(max_steps=3), fused)
    assert fused.backend == "loop"
    for tid, module in enumerate(separate):
        assert max_state_difference(fused.unfuse(tid), module) <= 1e-6


# -- rounding that flips a discontinuity (a ReLU kink) is not a mismatch; a real difference persists in float64 ---


class KinkFlipVmap(VmapBackend):
    """vmap whose float32 step carries a jump in one weight's gradient, as when rounding flips one ReLU unit.

    Measured on a hidden-1024, depth-4 MLP under load: 1 of 18 first-batch checks saw a 2.1e-4 gradient
    difference against a float32 rounding of 4.5e-9 (trials differing only in lr). The float64 copy of the group
    that the check builds runs on the plain backend, as a float64 run does not flip such a unit.
    """

    def run(self, method: str, *args: Any) -> StepOutputs:
        out = super().run(method, *args)
        loss = out.loss()
        if method == "training_step" and loss is not None and loss.dtype == torch.float32:
            out.output = loss + 1e-2 * self.group.params["body.0.weight"][:, 0, 0]
        return out


def _digits_batch() -> Any:
    train, _ = load_digits_tensors()
    return next(iter(DataLoader(train, batch_size=64)))


def test_a_float32_jump_the_fused_float64_step_does_not_reproduce_is_not_a_mismatch(caplog):
    trials = [seeded(lambda lr=lr: DigitsMLP(hidden_dim=16, lr=lr), [i])[0] for i, lr in enumerate([0.1, 0.3])]
    group = StackedState(torch.nn.Module(), trials, [0, 1])
    with caplog.at_level(logging.INFO, logger="lightning_hydro.fused.verify.fusion"):
        assert verify_fusion(group, KinkFlipVmap(group), [0, 1], _digits_batch(), 0)
    assert "trial 0's float32 difference (gradient of body.0.weight: |fused - own|" in caplog.text
    assert "vanishes when the fused step runs in float64" in caplog.text
    assert all(p.grad is None for p in group.params.values())  # the check leaves the group's gradients alone


def test_a_real_difference_is_confirmed_by_the_fused_float64_step():
    trials = [ConfiguredMLP(0.0, hidden_dim=8), ConfiguredMLP(0.3, hidden_dim=8)]
    group = StackedState(torch.nn.Module(), trials, [0, 1])
    with pytest.raises(FusionMismatchError, match=r"the float64 fused run differs too \(loss \(float64\): "):
        verify_fusion(group, make_backend("vmap", group), [0, 1], _digits_batch(), 0)
