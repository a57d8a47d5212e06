"""The trials' own batch-level hooks run per trial in a fused group, each as in its run alone.

The trials are shaped as Lightning's docs write these hooks: gradient norms logged from
``on_before_optimizer_step`` (``grad_norm``), the step's outputs kept from ``on_train_batch_end``, the loss seen in
``on_before_backward``, gradients read in ``on_after_backward``, the optimizer in ``on_before_zero_grad``, an epoch
cut short by ``on_train_batch_start`` returning -1, and evaluation outputs kept from ``on_validation_batch_end``.
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import grad_norm
from torch import nn

from lightning_hydro.backends.errors import FusionMismatchError
from lightning_hydro.demos import DigitsMLP
from tests.helpers import QuietLogger, fit_digits, seeded, train_fused, train_separately

BACKENDS = ["vmap", "hfta", "loop"]
LEARNING_RATES = (0.05, 0.2, 0.5)


class StepValues(QuietLogger):
    """Keeps every step value the Trainer hands the logger, by step."""

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[int, dict[str, float]] = {}

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.values.setdefault(int(step or 0), {}).update({k: float(v) for k, v in metrics.items()})


class GradNormMLP(DigitsMLP):
    """Lightning's docs: "Track gradient norms" with ``on_before_optimizer_step`` and ``grad_norm``."""

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        self.log_dict(grad_norm(self, norm_type=2))


class WatchesItsSteps(DigitsMLP):
    """Keeps what its batch hooks see, in Python lists, as research code does."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.starts: list[int] = []
        self.losses_before_backward: list[float] = []
        self.head_gradient_norms: list[float] = []
        self.learning_rates: list[float] = []
        self.outputs: list[float] = []

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.starts.append(batch_idx)

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self.losses_before_backward.append(loss.item())

    def on_after_backward(self) -> None:
        self.head_gradient_norms.append(self.head.weight.grad.norm().item())

    def on_before_zero_grad(self, optimizer: Any) -> None:
        self.learning_rates.append(optimizer.param_groups[0]["lr"])

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.outputs.append(outputs["loss"].item())


class ShortEpochs(DigitsMLP):
    """Lightning's docs: return -1 from ``on_train_batch_start`` to skip the rest of the epoch."""

    def __init__(self, batches: int = 3, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batches = batches

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        return -1 if batch_idx >= self.batches else None


class KeepsValidationOutputs(DigitsMLP):
    """A validation step that returns its loss, kept by ``on_validation_batch_end`` (with its own ``self.log``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.validation_losses: list[float] = []

    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("val_loss", loss)
        return {"val_loss": loss}

    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.validation_losses.append(outputs["val_loss"].item())
        self.log("val_seen", float(len(self.validation_losses)))


def _trials(cls: type[DigitsMLP], **kwargs: Any) -> list[DigitsMLP]:
    return [seeded(lambda lr=lr: cls(hidden_dim=16, lr=lr, **kwargs), [i])[0] for i, lr in enumerate(LEARNING_RATES)]


def _close(a: list[float], b: list[float], tolerance: float = 1e-4) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=tolerance, abs_tol=1e-6) for x, y in zip(a, b))


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_norms_logged_before_the_optimizer_step_are_each_trials_own(backend):
    trials = _trials(GradNormMLP)
    alone_loggers = []
    for trial in trials:
        logger = StepValues()
        train_separately([trial], fit_digits, max_steps=6, logger=logger, log_every_n_steps=1)
        alone_loggers.append(logger)
    fused_logger = StepValues()
    train_fused(
        trials, fit_digits, fused_kwargs={"backend": backend}, max_steps=6, logger=fused_logger, log_every_n_steps=1
    )
    name = "grad_2.0_norm_total"
    for tid, alone in enumerate(alone_loggers):
        steps = sorted(step for step, values in alone.values.items() if name in values)
        assert len(steps) >= 5
        mine = [fused_logger.values[step][f"{name}/trial_{tid}"] for step in steps]
        theirs = [alone.values[step][name] for step in steps]
        assert _close(mine, theirs), (backend, tid, mine, theirs)
        # every parameter's norm, as grad_norm names them
        assert {k for k in alone.values[steps[0]] if k.startswith("grad_2.0_norm/")} == {
            k.removesuffix(f"/trial_{tid}") for k in fused_logger.values[steps[0]] if k.endswith(f"/trial_{tid}")
        } - {name, "train_loss"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_trial_sees_its_own_loss_gradients_optimizer_and_outputs(backend):
    trials = _trials(WatchesItsSteps)
    alone = train_separately(trials, fit_digits, max_steps=5)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": backend}, max_steps=5)
    for tid, own in enumerate(alone):
        mine = fused.trial_module(tid)
        assert mine.starts == own.starts == [0, 1, 2, 3, 4]
        assert mine.learning_rates == own.learning_rates == [LEARNING_RATES[tid]] * 5
        for field in ("losses_before_backward", "head_gradient_norms", "outputs"):
            assert _close(getattr(mine, field), getattr(own, field)), (backend, tid, field)
        assert _close(mine.outputs, mine.losses_before_backward)  # the outputs hold the step's own loss


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_under_gradient_accumulation_the_hooks_see_the_divided_loss_as_alone(backend):
    trials = _trials(WatchesItsSteps)
    alone = train_separately(trials, fit_digits, max_steps=3, accumulate_grad_batches=2)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": backend}, max_steps=3, accumulate_grad_batches=2)
    for tid, own in enumerate(alone):
        mine = fused.trial_module(tid)
        assert mine.starts == own.starts == list(range(6))
        assert len(own.learning_rates) == len(own.head_gradient_norms) // 2 == 3  # zeroed once per optimizer step
        for field in ("losses_before_backward", "head_gradient_norms", "outputs", "learning_rates"):
            assert _close(getattr(mine, field), getattr(own, field)), (backend, tid, field)


def test_hooks_no_trial_overrides_are_not_run_and_gradients_stay_with_the_group():
    fused = train_fused(_trials(DigitsMLP), fit_digits, fused_kwargs={"backend": "vmap"}, max_steps=2)
    assert fused._batch_hooks.overridden == frozenset()
    watched = train_fused(_trials(WatchesItsSteps), fit_digits, fused_kwargs={"backend": "vmap"}, max_steps=2)
    assert "on_after_backward" in watched._batch_hooks.overridden
    # the gradient views handed to the hooks are dropped again: the fused update owns the stacked gradients
    assert all(p.grad is None for p in watched.trial_module(0).parameters())


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_minus_one_from_every_trials_batch_start_ends_each_epoch_as_alone(backend):
    trials = _trials(ShortEpochs)
    alone = train_separately(trials, fit_digits, max_epochs=2)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": backend}, max_epochs=2)
    assert alone[0].trainer.global_step == 6  # 3 batches in each of 2 epochs
    assert fused.trainer.global_step == alone[0].trainer.global_step
    for tid in range(len(trials)):
        assert fused.results[tid]["steps"] == 6


def test_minus_one_from_some_trials_only_is_refused_with_the_remedy():
    trials = [ShortEpochs(batches=3, hidden_dim=16), ShortEpochs(batches=100, hidden_dim=16)]
    with pytest.raises(ValueError, match=r"returned -1 .* for trials \[0\] only; .*stop_trial"):
        train_fused(trials, fit_digits, fused_kwargs={"backend": "vmap"}, max_steps=5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_validation_batch_end_gets_each_trials_own_outputs_and_logs_as_its_own(backend):
    trials = _trials(KeepsValidationOutputs)
    alone = train_separately(trials, fit_digits, max_epochs=1, limit_train_batches=3, limit_val_batches=2)
    fused = train_fused(
        trials, fit_digits, fused_kwargs={"backend": backend}, max_epochs=1, limit_train_batches=3, limit_val_batches=2
    )
    for tid, own in enumerate(alone):
        mine = fused.trial_module(tid) if tid in fused.trial_ids else None
        assert mine is not None
        assert len(mine.validation_losses) == len(own.validation_losses) == 2
        assert _close(mine.validation_losses, own.validation_losses), (backend, tid)
        metrics = fused.results[tid]["metrics"]
        assert metrics["val_seen"] == pytest.approx(own.trainer.callback_metrics["val_seen"].item())
        assert metrics["val_loss"] == pytest.approx(own.trainer.callback_metrics["val_loss"].item(), rel=1e-4)


class DropoutWarmUp(L.LightningModule):
    """A batch hook sets the dropout rate each step, reaching the trial's own rate after two steps."""

    def __init__(self, final_p: float = 0.0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.0), nn.Linear(32, 10))

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.net[2].p = self.hparams["final_p"] * min(1.0, self.global_step / 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def test_a_setting_a_batch_hook_makes_differ_is_still_refused_on_vmap():
    # the settings are re-read after every batch hook: the step where they come to differ is refused, not run
    # with the template's rate for all (the fast path skips the full check only while nothing changed)
    trials = [DropoutWarmUp(0.0), DropoutWarmUp(0.5)]
    with pytest.raises(FusionMismatchError, match=r"net.2.p \(trial 0: 0.0, trial 1: 0.25\)"):
        train_fused(trials, fit_digits, fused_kwargs={"backend": "vmap"}, max_steps=4)


class DropoutWarmUpByNewModule(DropoutWarmUp):
    """The same warm-up written as a new dropout module each step (the settings' reader must follow it)."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.net[2] = nn.Dropout(self.hparams["final_p"] * min(1.0, self.global_step / 2))


def test_a_setting_of_a_submodule_a_batch_hook_replaces_is_refused_on_vmap():
    trials = [DropoutWarmUpByNewModule(0.0), DropoutWarmUpByNewModule(0.5)]
    with pytest.raises(FusionMismatchError, match=r"net.2.p \(trial 0: 0.0, trial 1: 0.25\)"):
        train_fused(trials, fit_digits, fused_kwargs={"backend": "vmap"}, max_steps=4)


def test_hfta_runs_a_setting_a_batch_hook_changes_with_each_trials_own_value():
    trials = [seeded(lambda p=p: DropoutWarmUp(p), [0])[0] for p in (0.0, 0.5)]
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": "hfta"}, max_steps=4)
    assert [fused.trial_module(t).net[2].p for t in (0, 1)] == [0.0, 0.5]
    moved = max((a - b).abs().max().item() for a, b in zip(fused.unfuse(0).parameters(), fused.unfuse(1).parameters()))
    assert moved > 1e-4  # same weights and data: only their own dropout rates set them apart
