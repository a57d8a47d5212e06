"""Activation checkpointing (``torch.utils.checkpoint``) on the loop trains each trial as alone, reentrant or not.

The reentrant variant (``use_reentrant=True``, torch's default before 2.4 and what older code and Hugging Face's
``gradient_checkpointing_enable()`` ask for) runs the checkpointed block again during the backward pass, after the
loop has put the trial's own parameters back in place of the row views it ran the step with, and differentiates it
with a backward of its own. Its gradients landed on the trial's own parameters, not on the stacked rows, and were
dropped: the checkpointed block never moved (before: moved 0.0, alone 5.8e-3). vmap and hfta refuse checkpointing
(``tests/fused/verify/test_python_arguments.py``).
"""

from __future__ import annotations

import copy
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from lightning_hydro import FusedLightningModule
from tests.helpers import fit_digits, make_trainer, max_state_difference


class CheckpointedMLP(L.LightningModule):
    """An MLP whose middle block is checkpointed in training, as memory-saving code writes it."""

    def __init__(self, lr: float = 0.1, reentrant: bool = True) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.inp = nn.Linear(64, 16)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh())
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        h = checkpoint(self.block, h, use_reentrant=self.hparams["reentrant"]) if self.training else self.block(h)
        return self.head(h)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9)


def trials(reentrant: bool) -> list[CheckpointedMLP]:
    modules = []
    for seed, lr in enumerate((0.05, 0.2, 0.5)):
        torch.manual_seed(seed)
        modules.append(CheckpointedMLP(lr=lr, reentrant=reentrant))
    return modules


@pytest.mark.parametrize("optimizer_path", ["universal", "fused"])
@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointed_trials_train_on_the_loop_as_alone(reentrant, optimizer_path):
    modules = trials(reentrant)
    start = copy.deepcopy(modules)
    fused = FusedLightningModule(modules, backend="loop", optimizer_path=optimizer_path, summary=False)
    fit_digits(make_trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=0), fused)
    for index, initial in enumerate(start):
        alone = copy.deepcopy(initial)
        fit_digits(make_trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=0), alone)
        trained = fused.unfuse(index)
        assert not torch.equal(trained.block[0].weight, initial.block[0].weight)  # the checkpointed block moved
        assert max_state_difference(trained, alone) == 0.0  # bitwise
        logged = fused.trainer.callback_metrics[f"train_loss/trial_{index}"]
        assert logged == alone.trainer.callback_metrics["train_loss"]


def test_auto_chooses_the_loop_for_reentrant_checkpointing_and_trains_each_trial_as_alone():
    modules = trials(reentrant=True)
    start = copy.deepcopy(modules[1])
    fused = FusedLightningModule(modules, backend="auto", summary=False)
    fit_digits(make_trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=0), fused)
    assert fused.backend == "loop"
    fit_digits(make_trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=0), start)
    assert max_state_difference(fused.unfuse(1), start) == 0.0
