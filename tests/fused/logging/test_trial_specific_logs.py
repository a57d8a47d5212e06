"""A value that only some trials log (a condition on the trial's own hyperparameters): each trial has it as alone.

Such trials run on the loop (vmap and hfta refuse code that reads a differing hyperparameter). Before, the rows that
did not log it were handed on as None beside the others' values, and booking them failed ("'NoneType' object has
no attribute 'compute'" in a training step, "'Tensor' object has no attribute 'compute'" in a validation step).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsDataModule, DigitsMLP
from tests.helpers import make_trainer

LRS = (0.05, 0.2, 0.5)
FIT: dict[str, Any] = dict(max_epochs=2, limit_train_batches=3, limit_val_batches=2)


class LogsWhenSlow(DigitsMLP):
    """Logs extra values only where its learning rate is below 0.3, in its steps and an epoch-end hook."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        if self.hparams["lr"] < 0.3:
            self.log("slow_step", loss)
            self.log("slow_epoch", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        if self.hparams["lr"] < 0.3:
            self.log("slow_val", F.cross_entropy(self(x), y))

    def on_train_epoch_end(self) -> None:
        if self.hparams["lr"] < 0.3:
            self.log("slow_epochs", float(self.current_epoch))


@pytest.mark.parametrize("backend", ["loop", "auto"])
def test_values_only_some_trials_log_are_each_trials_own_as_alone(backend: str) -> None:
    trials = []
    for seed, lr in enumerate(LRS):
        torch.manual_seed(seed)
        trials.append(LogsWhenSlow(lr=lr, hidden_dim=16))
    alone = []
    for trial in trials:
        trainer = make_trainer(**FIT)
        torch.manual_seed(1234)
        trainer.fit(copy.deepcopy(trial), datamodule=DigitsDataModule())
        alone.append({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("slow")})
    fused = FusedLightningModule(copy.deepcopy(trials), backend=backend, summary=False)
    trainer = make_trainer(**FIT)
    torch.manual_seed(1234)
    trainer.fit(fused, datamodule=DigitsDataModule())
    for tid, own in enumerate(alone):
        mine = {
            k.removesuffix(f"/trial_{tid}"): float(v)
            for k, v in trainer.callback_metrics.items()
            if k.startswith("slow") and k.endswith(f"/trial_{tid}")
        }
        assert mine == pytest.approx(own, rel=1e-5), tid
    assert alone[2] == {}  # the case happened: trial 2 logs none of them, trials 0 and 1 all four
    assert len(alone[0]) == 4
