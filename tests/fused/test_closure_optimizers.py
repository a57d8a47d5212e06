"""Optimizers whose ``step`` needs a closure (``torch.optim.LBFGS``: its line search re-evaluates the loss).

Alone, Lightning hands ``training_step`` as the closure to ``LBFGS.step``. A fused group runs one forward/backward
for every trial, which cannot re-evaluate one trial's loss for its line search: under automatic optimization such
an optimizer is refused when the group asks for optimizers (before: ``TypeError: LBFGS.step() missing 1 required
positional argument: 'closure'`` from inside the library, at the first step). Under manual optimization, as
Lightning's manual-optimization page writes a closure, each trial's own closure runs on the loop, as alone.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_hydro import FusedLightningModule
from lightning_hydro.optim import OptimizerConfigError
from tests.helpers import (
    StopTrialAt,
    fit_digits,
    make_trainer,
    max_state_difference,
    seeded,
    train_fused,
    train_separately,
)

LRS = (0.1, 0.3, 1.0)


class LBFGSMLP(L.LightningModule):
    """A digits MLP trained by LBFGS, automatically (Lightning passes the closure) or manually (the step builds it)."""

    def __init__(self, lr: float = 0.1, manual: bool = True) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = not manual
        self.net = nn.Sequential(nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 10))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.automatic_optimization:
            return F.cross_entropy(self.net(x), y)
        opt = self.optimizers()

        def closure() -> torch.Tensor:
            loss = F.cross_entropy(self.net(x), y)
            opt.zero_grad()
            self.manual_backward(loss)
            return loss

        loss = opt.step(closure=closure)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.LBFGS(self.parameters(), lr=self.hparams["lr"], max_iter=4)


def trials(manual: bool) -> list[L.LightningModule]:
    lrs = iter(LRS)
    return seeded(lambda: LBFGSMLP(lr=next(lrs), manual=manual), range(len(LRS)))


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_lbfgs_under_automatic_optimization_is_refused_with_the_manual_recipe(backend: str) -> None:
    fused = FusedLightningModule(trials(manual=False), backend=backend, summary=False)
    with pytest.raises(
        OptimizerConfigError, match=r"Trial 0: LBFGS\.step needs a closure .*automatic_optimization = False"
    ):
        fit_digits(make_trainer(max_steps=2, limit_val_batches=0), fused)


@pytest.mark.parametrize("backend", ["loop", "auto"])
def test_lbfgs_under_manual_optimization_trains_each_trial_as_alone(backend: str) -> None:
    modules = trials(manual=True)
    kwargs: dict[str, Any] = dict(max_steps=6, limit_val_batches=0)
    alone = train_separately(modules, fit_digits, **kwargs)
    fused = train_fused(modules, fit_digits, fused_kwargs=dict(backend=backend), callbacks=[StopTrialAt(3)], **kwargs)
    assert fused.results[1]["status"] == "stopped"
    for trial_id in (0, 2):
        assert max_state_difference(fused.unfuse(trial_id), alone[trial_id]) == 0.0
