"""A trial a callback stops still runs its own batch-end and epoch-end hooks for that batch and epoch, as alone.

Alone, a callback ends a run with ``trainer.should_stop``, and Lightning still runs the module's ``on_train_batch_end``
after the callbacks' (they come first), and its ``on_train_epoch_end`` at the epoch the stop ends. In a group a stop
frees the slot at once; before, the stopped trial's own hooks for that batch and epoch were not run: an EMA of the
weights updated in ``on_train_batch_end`` missed its last update (3.1e-2 relative from alone), and an epoch-end hook
(an outputs list's mean, a count) missed its epoch. The trial's own modules run them after it left, at the
module's hooks, with its own optimizer and schedulers (``self.optimizers()``, ``self.lr_schedulers()``; before, a
hook that read them crashed the fit: the trial had left its slot).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from tests.helpers import StopTrialAt, fit_digits, max_state_difference, seeded, train_fused, train_separately

LRS = (0.05, 0.2, 0.5)


class EMAMLP(L.LightningModule):
    """Keeps an exponential moving average of its weights, updated after each batch (as diffusion and SSL code do)."""

    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
        self.ema = AveragedModel(self.net, multi_avg_fn=get_ema_multi_avg_fn(0.9))
        self.epoch_ends = 0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.ema.update_parameters(self.net)
        self.log("update_loss", outputs["loss"], on_step=False, on_epoch=True)
        self.log("lr", self.optimizers().param_groups[0]["lr"], on_step=False, on_epoch=True)  # its own optimizer

    def on_train_epoch_end(self) -> None:
        self.epoch_ends += 1
        self.last_lr = self.lr_schedulers().get_last_lr()[0]  # its own scheduler

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.net.parameters(), lr=self.hparams["lr"], momentum=0.9)
        schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def trials() -> list[EMAMLP]:
    lrs = iter(LRS)
    return seeded(lambda: EMAMLP(lr=next(lrs)), range(len(LRS)))


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_a_trial_stopped_after_its_step_runs_its_batch_end_and_epoch_end_hooks_as_alone(backend: str) -> None:
    modules = trials()
    fit: dict[str, Any] = dict(max_epochs=1, limit_train_batches=10, limit_val_batches=0)
    alone = train_separately(modules, fit_digits, **fit)
    alone_until_stop = train_separately(modules[1:2], fit_digits, **{**fit, "max_steps": 5})[0]
    fused = train_fused(modules, fit_digits, fused_kwargs=dict(backend=backend), callbacks=[StopTrialAt(5)], **fit)
    stopped = fused.unfuse(1)
    assert max_state_difference(stopped, alone_until_stop) <= 1e-5  # the EMA included: 5 updates, as alone
    assert int(stopped.ema.n_averaged) == 5
    assert stopped.epoch_ends == alone_until_stop.epoch_ends == 1
    metrics = fused.trainer.callback_metrics
    assert stopped.last_lr == alone_until_stop.last_lr
    for name in ("train_loss", "update_loss", "lr"):  # its epoch's values, its last batch-end hook's included
        own = float(alone_until_stop.trainer.callback_metrics[name])
        assert float(metrics[f"{name}/trial_1"]) == pytest.approx(own, rel=1e-5), name
    for trial_id in (0, 2):
        assert max_state_difference(fused.unfuse(trial_id), alone[trial_id]) <= 1e-5


class StopAtTheFirstEpochsEnd(L.Callback):
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if trainer.current_epoch == 0:
            pl_module.stop_trial(1, "an epoch budget")


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_a_trial_stopped_by_a_callbacks_epoch_end_runs_its_own_epoch_end_for_that_epoch(backend: str) -> None:
    # as the library's halving callbacks stop trials when there is no validation
    modules = trials()
    fit: dict[str, Any] = dict(max_epochs=2, limit_train_batches=3, limit_val_batches=0)
    alone_one_epoch = train_separately(modules[1:2], fit_digits, **{**fit, "max_epochs": 1})[0]
    fused = train_fused(
        modules, fit_digits, fused_kwargs=dict(backend=backend), callbacks=[StopAtTheFirstEpochsEnd()], **fit
    )
    assert fused.unfuse(1).epoch_ends == alone_one_epoch.epoch_ends == 1
    assert fused.unfuse(0).epoch_ends == 2
