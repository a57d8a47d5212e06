"""A checkpoint of a fused run restores every trial, its optimizer and scheduler state, the slots and results."""

from __future__ import annotations

import copy

import lightning as L
import pytest

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsMLP
from tests.helpers import ScheduledMLP, fit_digits, make_trainer, max_state_difference, seeded, train_separately

SHORT = dict(limit_train_batches=6, limit_val_batches=1)


def scheduled_trials(same_optimizer: bool = False) -> list[ScheduledMLP]:
    configs = (
        [(3e-3, "adam"), (1e-3, "adam"), (1e-2, "adam")]
        if same_optimizer
        else [(0.1, "sgd"), (3e-3, "adam"), (1e-2, "adamw")]
    )
    return [
        seeded(lambda lr=lr, opt=opt: ScheduledMLP("epoch", hidden_dim=16, lr=lr, optimizer=opt), [i])[0]
        for i, (lr, opt) in enumerate(configs)
    ]


class StopAtEpochEnd(L.Callback):
    def __init__(self, epoch: int, trial: int, replacement: L.LightningModule | None = None) -> None:
        self.epoch, self.trial, self.replacement = epoch, trial, replacement

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch and self.trial in pl_module.trial_ids:
            pl_module.stop_trial(self.trial, "test")
            if self.replacement is not None:
                pl_module.add_trial(copy.deepcopy(self.replacement))


@pytest.mark.parametrize("optimizer_path", ["universal", "fused"])
def test_two_plus_two_epochs_equal_four(tmp_path, optimizer_path):
    trials = scheduled_trials(same_optimizer=optimizer_path == "fused")
    separate = train_separately(trials, fit_digits, max_epochs=4, **SHORT)
    kwargs = {"backend": "vmap", "optimizer_path": optimizer_path, "summary": False}
    first = FusedLightningModule([copy.deepcopy(t) for t in trials], **kwargs)
    trainer = make_trainer(max_epochs=2, **SHORT)
    fit_digits(trainer, first)
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    resumed = FusedLightningModule([copy.deepcopy(t) for t in trials], **kwargs)  # a fresh process would do this
    fit_digits(make_trainer(max_epochs=4, **SHORT), resumed, ckpt_path=tmp_path / "mid.ckpt")
    assert resumed._optimizer.active_path == ("fused" if optimizer_path == "fused" else "universal")
    for tid, module in enumerate(separate):
        assert max_state_difference(resumed.unfuse(tid), module) <= 1e-5
        assert resumed.results[tid]["budget"] == 4
        assert resumed.results[tid]["steps"] == 24
        assert len(resumed.results[tid]["history"]) == 4


def test_slot_map_retired_trials_and_refilled_trials_come_back(tmp_path):
    trials = scheduled_trials()
    newcomer = seeded(lambda: DigitsMLP(hidden_dim=16, lr=0.05), [9])[0]
    kwargs = {"backend": "vmap", "summary": False}
    callbacks = [StopAtEpochEnd(epoch=0, trial=1, replacement=newcomer)]
    uninterrupted = FusedLightningModule([copy.deepcopy(t) for t in trials], **kwargs)
    fit_digits(make_trainer(max_epochs=3, callbacks=callbacks, **SHORT), uninterrupted)

    first = FusedLightningModule([copy.deepcopy(t) for t in trials], **kwargs)
    trainer = make_trainer(max_epochs=2, callbacks=[StopAtEpochEnd(0, 1, newcomer)], **SHORT)
    fit_digits(trainer, first)
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    resumed = FusedLightningModule([copy.deepcopy(t) for t in trials], **kwargs)
    fit_digits(make_trainer(max_epochs=3, **SHORT), resumed, ckpt_path=tmp_path / "mid.ckpt")

    assert resumed.trial_ids == uninterrupted.trial_ids == [0, 2, 3]
    assert resumed.results[1]["status"] == "stopped"
    assert isinstance(resumed.trial_module(3), DigitsMLP)  # rebuilt from its class and saved hyperparameters
    for tid in (0, 1, 2, 3):
        assert max_state_difference(resumed.unfuse(tid), uninterrupted.unfuse(tid)) <= 1e-5
        assert resumed.results[tid]["steps"] == uninterrupted.results[tid]["steps"]
        assert resumed.results[tid]["status"] == uninterrupted.results[tid]["status"]


def test_loading_a_checkpoint_of_a_plain_module_is_refused(tmp_path):
    plain = DigitsMLP(hidden_dim=8)
    trainer = make_trainer(max_steps=1)
    fit_digits(trainer, plain)
    trainer.save_checkpoint(tmp_path / "plain.ckpt")
    fused = FusedLightningModule([DigitsMLP(hidden_dim=8)], backend="vmap")
    with pytest.raises(KeyError, match="not written by a FusedLightningModule"):
        fit_digits(make_trainer(max_steps=2), fused, ckpt_path=tmp_path / "plain.ckpt")


def test_a_checkpoint_written_after_every_trial_ended_is_refused_with_the_reason():
    fused = FusedLightningModule([DigitsMLP(hidden_dim=8), DigitsMLP(hidden_dim=8)], summary=False)
    entry = {"trial_ids": [], "records": {0: {}, 1: {}}}
    with pytest.raises(ValueError, match=r"holds no running trial \(trials 0, 1 had all ended when it was written\)"):
        fused.on_load_checkpoint({"lightning_hydro": entry})
