"""A torchmetrics object a trial logs is reset at each epoch's end, as Lightning resets every metric object it was
given, whatever ``on_step``/``on_epoch`` say (lightning_hydro/fused/logging/metrics.py)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torchmetrics import RunningMean
from torchmetrics.classification import MulticlassAccuracy

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsDataModule, DigitsMLP
from tests.helpers import SeriesLogger, make_trainer

LEARNING_RATES = (0.05, 0.1, 0.2)
LIMITS: dict[str, Any] = dict(max_epochs=3, limit_train_batches=4, limit_val_batches=2, log_every_n_steps=1)


class StepOnlyMetrics(DigitsMLP):
    """Metric objects logged on step only (training_step's default), their epoch value computed by hand."""

    def __init__(self, lr: float) -> None:
        super().__init__(hidden_dim=16, lr=lr)
        self.train_acc = MulticlassAccuracy(num_classes=10)
        self.train_running = RunningMean(window=3)
        self.val_acc = MulticlassAccuracy(num_classes=10)
        self.counted: list[int] = []  # the samples train_acc holds at each training epoch's end

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        self.train_acc(logits, y)
        self.log("train/acc", self.train_acc)
        self.train_running(loss.detach())
        self.log("train/running", self.train_running)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.val_acc(self(x), y)
        self.log("val/acc", self.val_acc, on_step=True, on_epoch=False)

    def on_train_epoch_end(self) -> None:
        self.log("train/acc_by_hand", self.train_acc.compute())
        self.counted.append(int(self.train_acc.tp.sum() + self.train_acc.fn.sum()))

    def on_validation_epoch_end(self) -> None:
        self.log("val/acc_by_hand", self.val_acc.compute())


def metric_states(module: StepOnlyMetrics) -> dict[str, torch.Tensor]:
    return {
        f"{name}.{state}": torch.as_tensor(value)
        for name in ("train_acc", "train_running", "val_acc")
        for state, value in getattr(module, name).metric_state.items()
    }


@pytest.mark.parametrize("backend", ["loop", "vmap", "hfta"])
def test_a_metric_object_logged_on_step_only_is_reset_at_each_epoch_end_as_alone(backend: str) -> None:
    modules = []
    for seed, lr in enumerate(LEARNING_RATES):
        torch.manual_seed(seed)
        modules.append(StepOnlyMetrics(lr))
    alone = []
    for module in modules:
        logger, copied = SeriesLogger(), copy.deepcopy(module)
        torch.manual_seed(1234)
        make_trainer(logger=logger, **LIMITS).fit(copied, datamodule=DigitsDataModule())
        alone.append((copied, logger.series))
    logger = SeriesLogger()
    fused = FusedLightningModule(copy.deepcopy(modules), backend=backend, summary=False)
    torch.manual_seed(1234)
    make_trainer(logger=logger, **LIMITS).fit(fused, datamodule=DigitsDataModule())

    for tid, (module, series) in enumerate(alone):
        assert module.counted == [256, 256, 256]  # Lightning resets train_acc after each epoch
        trial = fused.trial_module(tid)
        assert trial.counted == module.counted
        suffix = f"/trial_{tid}"
        logged = {key[: -len(suffix)]: steps for key, steps in logger.series.items() if key.endswith(suffix)}
        assert sorted(logged) == sorted(series)
        for name, steps in series.items():
            assert [step for step, _ in logged[name]] == [step for step, _ in steps], name
            assert [value for _, value in logged[name]] == pytest.approx([value for _, value in steps], rel=1e-5), name
        fused_states, alone_states = metric_states(trial), metric_states(module)
        for name, value in alone_states.items():
            assert torch.equal(fused_states[name], value), name  # zero: reset after the last epoch
