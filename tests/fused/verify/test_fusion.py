"""Fusion is verified, not assumed; what vmap cannot batch is reported with the op, the line and the fix."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import torchmetrics

from lightning_hydro import FusedLightningModule, FusionError, FusionMismatchError
from lightning_hydro.demos import DigitsMLP
from tests.helpers import fit_digits, make_trainer, max_state_difference, seeded, train_fused, train_separately


class SmoothedMLP(DigitsMLP):
    """Label smoothing is a Python float used by the step: vmap would apply trial 0's to every trial."""

    def __init__(self, smoothing: float = 0.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.smoothing = smoothing

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y, label_smoothing=self.smoothing)


def test_differing_python_attributes_the_step_reads_are_refused_when_the_group_is_built():
    trials = [SmoothedMLP(smoothing=0.0, hidden_dim=8), SmoothedMLP(smoothing=0.3, hidden_dim=8)]
    with pytest.raises(
        FusionMismatchError,
        match=r"backend='vmap' cannot fuse these SmoothedMLP trials: .* reads Python values that differ between "
        r"trials: smoothing \(trial 0: 0.0, trial 1: 0.3\).*Use backend='loop'",
    ):
        FusedLightningModule(trials, backend="vmap", summary=False)


def test_the_loop_backend_runs_each_trials_own_attributes():
    trials = [seeded(lambda s=s: SmoothedMLP(smoothing=s, hidden_dim=8), [i])[0] for i, s in enumerate([0.0, 0.3])]
    separate = train_separately(trials, fit_digits, max_steps=5)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": "loop"}, max_steps=5)
    assert max_state_difference(fused.unfuse(1), separate[1]) <= 1e-6


class ItemMLP(DigitsMLP):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        if loss.item() > 100:  # data-dependent Python control flow
            loss = loss * 0
        return loss


def test_ops_vmap_cannot_batch_are_named_with_the_line_and_the_fix():
    fused = FusedLightningModule([ItemMLP(hidden_dim=8), ItemMLP(hidden_dim=8)], backend="vmap", summary=False)
    with pytest.raises(
        FusionError,
        match=r"backend='vmap' cannot fuse ItemMLP.training_step: it calls .item\(\).*"
        r"test_fusion.py:\d+ in training_step: if loss.item\(\) > 100:.*Use backend='loop'",
    ):
        fit_digits(make_trainer(max_steps=1), fused)


class MetricMLP(DigitsMLP):
    """The common torchmetrics pattern: a stateful metric updated in validation_step."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=10)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.accuracy(self(x), y)
        self.log("val_acc", self.accuracy)


def test_torchmetrics_in_validation_stay_fused_and_per_trial():
    trials = [seeded(lambda lr=lr: MetricMLP(hidden_dim=16, lr=lr), [i])[0] for i, lr in enumerate([0.05, 0.2])]
    separate = train_separately(trials, fit_digits, max_epochs=2, limit_train_batches=5)
    fused = FusedLightningModule(trials, backend="vmap", summary=False)
    trainer = make_trainer(max_epochs=2, limit_train_batches=5)
    fit_digits(trainer, fused)
    assert (
        fused._eval_steps.backend("validation_step").name == "vmap"
    )  # validation fused too, metrics replayed per trial
    assert fused.backend == "vmap"
    for tid, module in enumerate(separate):
        expected = module.trainer.callback_metrics["val_acc"].item()
        assert trainer.callback_metrics[f"val_acc/trial_{tid}"].item() == pytest.approx(expected)


def test_auto_backend_chooses_by_timing_and_changes_no_numbers():
    from tests.helpers import DigitsCNN

    trials = [seeded(lambda lr=lr: DigitsCNN(lr=lr), [i])[0] for i, lr in enumerate([0.02, 0.05])]
    separate = train_separately(trials, fit_digits, max_steps=8)
    fused = train_fused(trials, fit_digits, fused_kwargs={"backend": "auto"}, max_steps=8)
    assert fused.backend in ("vmap", "loop")
    assert "backend='auto' chose" in fused.backend_report
    assert " ms" in fused.backend_report
    for tid, module in enumerate(separate):  # BatchNorm statistics and RNG were restored after timing
        assert max_state_difference(fused.unfuse(tid), module) <= 1e-4


def test_auto_skips_backends_that_cannot_run_the_model():
    fused = train_fused(
        [ItemMLP(hidden_dim=8), ItemMLP(hidden_dim=8)], fit_digits, fused_kwargs={"backend": "auto"}, max_steps=2
    )
    assert fused.backend == "loop"
    assert "vmap skipped: backend='vmap' cannot fuse ItemMLP.training_step" in fused.backend_report


class TrainMetricMLP(DigitsMLP):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.train_acc = torchmetrics.Accuracy(task="multiclass", num_classes=10)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        self.train_acc(logits, y)
        return F.cross_entropy(logits, y)


@pytest.mark.parametrize("backend", ["vmap", "hfta", "loop"])
def test_torchmetrics_updated_in_training_step_run_fused_per_trial(backend):
    fused = train_fused(
        [TrainMetricMLP(hidden_dim=8), TrainMetricMLP(hidden_dim=8)],
        fit_digits,
        fused_kwargs={"backend": backend},
        max_steps=2,
    )
    assert fused.backend == backend
    # each trial's own metric, updated once per step (the first-batch check's extra steps do not count)
    assert [fused.trial_module(tid).train_acc.update_count for tid in (0, 1)] == [2, 2]


def test_auto_times_the_fused_backends_for_training_step_metrics_and_says_so():
    fused = train_fused(
        [TrainMetricMLP(hidden_dim=8), TrainMetricMLP(hidden_dim=8)],
        fit_digits,
        fused_kwargs={"backend": "auto"},
        max_steps=2,
    )
    assert re.search(r"hfta [\d.]+ ms.*|vmap [\d.]+ ms", fused.backend_report), fused.backend_report
    assert "skipped" not in fused.backend_report
    if fused.backend != "loop":
        assert "torchmetrics train_acc run per trial after each fused step" in fused.backend_report
    assert fused.trial_module(1).train_acc.update_count == 2  # the timing steps do not count


class EvalTargetInStep(DigitsMLP):
    """Self-distillation: a target from the model in eval mode (BatchNorm's running statistics), then train mode."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.norm = torch.nn.BatchNorm1d(kwargs["hidden_dim"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.body(x)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.eval()
        with torch.no_grad():
            target = F.softmax(self(x), -1)
        self.train()
        logits = self(x)
        return F.cross_entropy(logits, y) + 0.5 * F.kl_div(F.log_softmax(logits, -1), target, reduction="batchmean")


@pytest.mark.parametrize(("backend", "tolerance"), [("vmap", 1e-5), ("hfta", 1e-5), ("loop", 0.0)])
def test_a_step_that_goes_back_to_train_mode_trains_as_alone(backend, tolerance):
    # the first-batch check ran in eval mode and restored the buffers between a run's forward and its backward: the
    # step's self.train() had moved BatchNorm's statistics, which the backward reads (before, vmap refused with
    # torch's in-place error and hfta raised it raw)
    trials = seeded(lambda: EvalTargetInStep(hidden_dim=8, lr=0.1), range(3))
    alone = train_separately(trials, fit_digits, max_steps=3)
    fused = train_fused(trials, fit_digits, fused_kwargs=dict(backend=backend), max_steps=3)
    assert fused.backend == backend
    for tid, single in enumerate(alone):
        assert max_state_difference(fused.unfuse(tid), single) <= tolerance
