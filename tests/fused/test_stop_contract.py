"""The fit ends when the group does: the module ends it from its own hooks, nobody resets ``should_stop``.

Lightning calls the callbacks' ``on_train_batch_end`` / ``on_validation_end`` / ``on_train_epoch_end`` before the
module's, so a callback that stops the last trial may refill the slot in the same hook and training goes on; without
a refill the fit ends after that hook, with no further training step. A trial stopped elsewhere (e.g. at an epoch's
start) leaves an empty group whose next batch is skipped (``on_train_batch_start`` returns -1).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
from lightning.pytorch.callbacks import EarlyStopping

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsMLP
from tests.helpers import fit_digits, make_trainer

BATCHES = 4  # training batches per epoch in these tests


class CountingMLP(DigitsMLP):
    """A DigitsMLP that counts its training steps (under the loop backend: one call per batch it trains on)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.steps_run = 0

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.steps_run += 1
        return super().training_step(batch, batch_idx)


class CountingFused(FusedLightningModule):
    """Counts the fused training steps Lightning runs (an empty group must run none)."""

    fused_steps = 0

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.fused_steps += 1
        return super().training_step(batch, batch_idx)


class StopAll(L.Callback):
    """In ``hook`` at (``epoch``, ``batch``), stops every running trial and adds ``refill`` (if any) there too."""

    def __init__(self, hook: str, epoch: int, batch: int | None = None, refill: L.LightningModule | None = None):
        self.hook, self.epoch, self.batch, self.refill = hook, epoch, batch, refill
        self.fired = 0
        self.added: int | None = None

    def _act(self, trainer: L.Trainer, fused: FusedLightningModule, batch_idx: int | None = None) -> None:
        if trainer.sanity_checking or trainer.current_epoch != self.epoch or self.fired:
            return
        if self.batch is not None and batch_idx != self.batch:
            return
        self.fired += 1
        for tid in fused.trial_ids:
            fused.stop_trial(tid, f"StopAll in {self.hook}")
        assert not trainer.should_stop  # stop_trial leaves the Trainer alone: the module decides after this hook
        if self.refill is not None:
            self.added = fused.add_trial(self.refill)

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        if self.hook == "on_train_epoch_start":
            self._act(trainer, pl_module)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.hook == "on_train_batch_end":
            self._act(trainer, pl_module, batch_idx)

    def on_validation_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if self.hook == "on_validation_end":
            self._act(trainer, pl_module)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if self.hook == "on_train_epoch_end":
            self._act(trainer, pl_module)


def _fit(callback: L.Callback, *, max_epochs: int = 3, validate: bool = True) -> tuple[CountingFused, L.Trainer]:
    trials = [CountingMLP(hidden_dim=8, lr=lr) for lr in (0.05, 0.1)]
    fused = CountingFused(trials, backend="loop", summary=False)
    limits: dict[str, Any] = {"limit_val_batches": 1} if validate else {"limit_val_batches": 0}
    trainer = make_trainer(max_epochs=max_epochs, limit_train_batches=BATCHES, callbacks=[callback], **limits)
    fit_digits(trainer, fused)
    return fused, trainer


def _steps_of(fused: FusedLightningModule, trial_id: int) -> int:
    module = fused.trial_module(trial_id)
    assert isinstance(module, CountingMLP)
    return module.steps_run


@pytest.mark.parametrize(
    ("hook", "validate"),
    [("on_train_batch_end", True), ("on_validation_end", True), ("on_train_epoch_end", False)],
)
def test_stopping_the_last_trial_and_refilling_in_the_same_hook_keeps_training(hook, validate):
    batch = 1 if hook == "on_train_batch_end" else None
    probe = StopAll(hook, epoch=0, batch=batch, refill=CountingMLP(hidden_dim=8, lr=0.2))
    fused, trainer = _fit(probe, max_epochs=3, validate=validate)
    assert probe.fired == 1
    assert probe.added == 2
    assert trainer.current_epoch == 3  # max_epochs reached: the refill kept the fit going
    assert trainer.global_step == 3 * BATCHES
    assert fused.fused_steps == 3 * BATCHES
    done_in_epoch_0 = 2 if hook == "on_train_batch_end" else BATCHES
    assert _steps_of(fused, 0) == _steps_of(fused, 1) == done_in_epoch_0
    assert _steps_of(fused, 2) == 3 * BATCHES - done_in_epoch_0  # the newcomer trained every later batch
    assert fused.results[2]["status"] == "completed"
    assert {fused.results[t]["status"] for t in (0, 1)} == {"stopped"}


@pytest.mark.parametrize(
    ("hook", "validate", "steps"),
    [
        ("on_train_batch_end", True, 2),  # stopped after the second batch of epoch 0
        ("on_validation_end", True, BATCHES),  # after epoch 0's validation
        ("on_train_epoch_end", False, BATCHES),  # at epoch 0's end, without validation
    ],
)
def test_stopping_the_last_trial_without_refill_ends_the_fit_after_that_hook(hook, validate, steps):
    probe = StopAll(hook, epoch=0, batch=1 if hook == "on_train_batch_end" else None)
    fused, trainer = _fit(probe, max_epochs=3, validate=validate)
    assert probe.fired == 1
    assert fused.trial_ids == []
    assert trainer.should_stop
    assert trainer.global_step == steps  # no training step after the hook that stopped the last trial
    assert fused.fused_steps == steps
    assert _steps_of(fused, 0) == _steps_of(fused, 1) == steps
    assert trainer.current_epoch == 1  # epoch 0 completed, no further epoch started
    assert {r["status"] for r in fused.results.values()} == {"stopped"}


def test_a_stop_at_an_epochs_start_runs_no_empty_step():
    probe = StopAll("on_train_epoch_start", epoch=1)
    fused, trainer = _fit(probe, max_epochs=4)
    assert probe.fired == 1
    assert trainer.should_stop  # set by the module's on_train_batch_start, which skipped the epoch's batches
    assert trainer.global_step == BATCHES  # epoch 0 only
    assert fused.fused_steps == BATCHES  # Lightning never called training_step for the empty group
    assert _steps_of(fused, 0) == _steps_of(fused, 1) == BATCHES
    assert trainer.current_epoch == 2  # epoch 1 ended at its first batch; no epoch 2
    assert {r["epochs"] for r in fused.results.values()} == {1}


class ConstantMLP(DigitsMLP):
    """Logs metrics that never improve, so EarlyStopping(patience=0) stops it at its second check."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("constant_train", 1.0, on_step=False, on_epoch=True)
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("constant_val", 1.0)
        super().validation_step(batch, batch_idx)


@pytest.mark.parametrize(
    ("monitor", "at_train_epoch_end"),
    [("constant_train", True), ("constant_val", False)],  # EarlyStopping checks after the module's hook / before
)
def test_early_stopping_of_every_trial_ends_the_fit_where_an_unfused_fit_ends(monitor, at_train_epoch_end):
    def trainer() -> L.Trainer:
        stopping = EarlyStopping(monitor=monitor, patience=0, check_on_train_epoch_end=at_train_epoch_end)
        return make_trainer(max_epochs=6, limit_train_batches=BATCHES, limit_val_batches=1, callbacks=[stopping])

    alone, fused_trainer = trainer(), trainer()
    fit_digits(alone, ConstantMLP(hidden_dim=8))
    fused = FusedLightningModule([ConstantMLP(hidden_dim=8, lr=lr) for lr in (0.05, 0.1)], summary=False)
    fit_digits(fused_trainer, fused)
    assert fused.trial_ids == []
    assert alone.global_step == 2 * BATCHES  # the unfused run stopped at its second check
    assert (fused_trainer.global_step, fused_trainer.current_epoch) == (alone.global_step, alone.current_epoch)
