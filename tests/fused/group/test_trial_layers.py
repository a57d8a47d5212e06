"""Layers a trial gets after its ``__init__``: fused as alone, or refused with the cause and the remedy.

A fused group stacks the trials' parameters when it is built. Before: an unmaterialised ``nn.LazyLinear`` crashed in
the stacking (torch's ``Can't access the shape of an uninitialized parameter``).
"""

from __future__ import annotations

import copy
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsMLP
from tests.helpers import fit_digits, make_trainer, max_state_difference

LRS = (0.05, 0.2, 0.5)


class DigitsNet(L.LightningModule):
    """The step and optimizer of the modules below; each builds its layers its own way."""

    net: nn.Module

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"], momentum=0.9)


class LazyNet(DigitsNet):
    def __init__(self, lr: float = 0.1, materialise: bool = False) -> None:
        super().__init__(lr)
        self.net = nn.Sequential(nn.LazyLinear(16), nn.ReLU(), nn.LazyLinear(10))
        if materialise:
            self(torch.zeros(1, 64))  # what the refusal advises


def fit(module: L.LightningModule) -> None:
    fit_digits(make_trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=0), module)


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_lazy_layers_not_materialised_are_refused_by_name_with_the_remedy(backend):
    with pytest.raises(
        ValueError,
        match=r"FusedLightningModule: trial 0 \(LazyNet\) has lazy layers that no forward has materialised yet: "
        r"'net.0' \(LazyLinear\), 'net.2' \(LazyLinear\)\. .*Run one forward on each trial before fusing it",
    ):
        FusedLightningModule([LazyNet(lr) for lr in LRS], backend=backend)


def test_a_lazy_newcomer_is_refused_by_add_trial():
    fused = FusedLightningModule([LazyNet(0.1, materialise=True)], max_slots=2, summary=False)
    with pytest.raises(ValueError, match=r"add_trial: trial 1 \(LazyNet\) has lazy layers .*'net.0' \(LazyLinear\)"):
        fused.add_trial(LazyNet(0.2))
    assert fused.trial_ids == [0]


def test_lazy_layers_materialised_by_one_forward_fuse_as_alone():
    trials = []
    for seed, lr in enumerate(LRS):
        torch.manual_seed(seed)
        trials.append(LazyNet(lr, materialise=True))
    alone = copy.deepcopy(trials)
    fused = FusedLightningModule(trials, backend="loop", summary=False)
    fit(fused)
    for index, module in enumerate(alone):
        fit(module)
        assert max_state_difference(fused.unfuse(index), module) == 0.0


def test_modules_without_lazy_layers_pass():
    FusedLightningModule([DigitsMLP(hidden_dim=8), DigitsMLP(hidden_dim=8)])
