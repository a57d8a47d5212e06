"""Slots: stopping a trial compacts the group; adding one fills a free slot with fresh optimizer state."""

from __future__ import annotations

import lightning as L
import pytest

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsMLP
from tests.helpers import (
    fit_digits,
    make_trainer,
    max_state_difference,
    mixed_optimizer_mlps,
    seeded,
    train_separately,
)


class SlotProbe(L.Callback):
    """Stops (and optionally replaces) a trial at the end of epoch 0; records the stacked rows per batch."""

    def __init__(self, stop: int, replacement: L.LightningModule | None = None) -> None:
        self.stop, self.replacement = stop, replacement
        self.rows: list[int] = []
        self.new_id: int | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.rows.append(pl_module.stacked.get_parameter("head__weight").shape[0])

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == 0:
            pl_module.stop_trial(self.stop, "probe decided")
            if self.replacement is not None:
                self.new_id = pl_module.add_trial(self.replacement)


@pytest.mark.parametrize("backend", ["vmap", "hfta", "loop"])
def test_stopping_compacts_and_survivors_keep_everything(backend):
    trials = mixed_optimizer_mlps()
    separate_2 = train_separately(trials, fit_digits, max_epochs=2, limit_train_batches=8, limit_val_batches=1)
    separate_1 = train_separately(trials[1:2], fit_digits, max_epochs=1, limit_train_batches=8, limit_val_batches=1)
    probe = SlotProbe(stop=1)
    fused = FusedLightningModule([t for t in trials], backend=backend, summary=False)
    fit_digits(make_trainer(max_epochs=2, limit_train_batches=8, limit_val_batches=1, callbacks=[probe]), fused)
    assert probe.rows == [4] * 8 + [3] * 8  # later steps really run on B-1 trials
    assert fused.trial_ids == [0, 2, 3]
    assert fused.results[1]["status"] == "stopped"
    assert fused.results[1]["reason"] == "probe decided"
    assert fused.results[1]["budget"] == 1
    assert fused.results[0]["budget"] == 2
    for tid in (0, 2, 3):  # optimizer (SGD momentum, Adam, AdamW) state followed each survivor
        assert max_state_difference(fused.unfuse(tid), separate_2[tid]) <= 1e-5
    assert max_state_difference(fused.unfuse(1), separate_1[0]) <= 1e-5  # the stopped trial keeps its weights


def test_a_freed_slot_is_refilled_with_fresh_optimizer_state():
    trials = mixed_optimizer_mlps()[2:]  # Adam and AdamW: optimizer state is visible in `step`
    newcomer = DigitsMLP(hidden_dim=32, lr=2e-3, optimizer="adam")
    probe = SlotProbe(stop=0, replacement=newcomer)
    fused = FusedLightningModule(trials, backend="vmap", summary=False)
    fit_digits(make_trainer(max_epochs=3, limit_train_batches=5, limit_val_batches=1, callbacks=[probe]), fused)
    assert probe.new_id == 2
    assert probe.rows == [2] * 15  # the slot was freed and filled at once
    assert fused.trial_ids == [1, 2]
    assert fused.results[2]["steps"] == 10
    assert fused.results[2]["budget"] == 2
    assert fused.results[1]["steps"] == 15
    fused._optimizer.materialize()
    newcomer_state = fused._optimizer.trials[2].optimizer.state
    assert {int(s["step"]) for s in newcomer_state.values()} == {10}  # fresh Adam state, not inherited


def test_add_trial_errors():
    fused = FusedLightningModule([DigitsMLP(hidden_dim=8)], backend="vmap", max_slots=2, summary=False)
    with pytest.raises(ValueError, match=r"trial id 0 is already used; known ids: \[0\]"):
        fused.add_trial(DigitsMLP(hidden_dim=8), trial_id=0)
    assert fused.add_trial(DigitsMLP(hidden_dim=8)) == 1
    with pytest.raises(RuntimeError, match="all 2 slots are taken; stop a trial first"):
        fused.add_trial(DigitsMLP(hidden_dim=8))
    with pytest.raises(TypeError, match=r"add_trial: expected a lightning\.LightningModule, got int"):
        fused.add_trial(3)  # type: ignore[arg-type]


def test_add_trial_checks_the_architecture():
    from lightning_hydro import ArchitectureMismatchError

    fused = FusedLightningModule([DigitsMLP(hidden_dim=8)], backend="vmap", max_slots=2, summary=False)
    with pytest.raises(ArchitectureMismatchError, match="Trial 1 cannot be fused with the group"):
        fused.add_trial(DigitsMLP(hidden_dim=16))


def test_stop_trial_errors():
    fused = FusedLightningModule([DigitsMLP(hidden_dim=8), DigitsMLP(hidden_dim=8)], backend="vmap")
    with pytest.raises(KeyError, match=r"trial 5 is not running; running trials: \[0, 1\]"):
        fused.stop_trial(5)
    with pytest.raises(ValueError, match="status must be 'stopped', 'completed' or 'diverged', got 'paused'"):
        fused.stop_trial(0, status="paused")  # type: ignore[arg-type]


def test_trials_added_before_fit_train_from_the_start():
    fused = FusedLightningModule([DigitsMLP(hidden_dim=8)], backend="vmap", max_slots=3, summary=False)
    fused.add_trial(DigitsMLP(hidden_dim=8, lr=0.2), trial_id=10)
    fit_digits(make_trainer(max_steps=4), fused)
    assert fused.trial_ids == [0, 10]
    assert fused.results[10]["steps"] == 4


class StopAllBut(L.Callback):
    """At the end of epoch 0 stops every trial but ``keep``; at the end of epoch 1 adds ``newcomer``."""

    def __init__(self, keep: int, newcomer: L.LightningModule) -> None:
        self.keep, self.newcomer = keep, newcomer
        self.backends: list[str | None] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.backends.append(pl_module.backend)  # the backend that ran this batch

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == 0:
            for tid in [t for t in pl_module.trial_ids if t != self.keep]:
                pl_module.stop_trial(tid, "probe decided")
        elif trainer.current_epoch == 1:
            pl_module.add_trial(self.newcomer)


@pytest.mark.parametrize("chosen", ["vmap", "hfta"])
def test_auto_runs_a_lone_trial_on_the_loop_and_a_newcomer_brings_its_choice_back(monkeypatch, chosen):
    from lightning_hydro.backends import auto

    def choose(group, candidates, run_step, **kwargs):  # auto's timing is machine-dependent: fix its choice
        return auto.AutoChoice(dict(candidates)[chosen]())

    monkeypatch.setattr("lightning_hydro.fused.module.choose_backend", choose)
    trials = mixed_optimizer_mlps()
    separate = train_separately(trials[2:3], fit_digits, max_epochs=3, limit_train_batches=4, limit_val_batches=1)
    probe = StopAllBut(keep=2, newcomer=DigitsMLP(hidden_dim=32, lr=0.1))
    fused = FusedLightningModule(trials, backend="auto", max_slots=4, summary=False)
    fit_digits(make_trainer(max_epochs=3, limit_train_batches=4, limit_val_batches=1, callbacks=[probe]), fused)
    assert probe.backends == [chosen] * 4 + ["loop"] * 4 + [chosen] * 4
    assert fused.trial_ids == [2, 4]
    assert max_state_difference(fused.unfuse(2), separate[0]) <= 1e-5  # Adam's state survived both switches


def test_a_checkpoint_keeps_autos_choice_while_a_lone_trial_runs_on_the_loop(monkeypatch):
    from lightning_hydro.backends import auto

    monkeypatch.setattr(
        "lightning_hydro.fused.module.choose_backend",
        lambda group, candidates, run_step, **kwargs: auto.AutoChoice(dict(candidates)["vmap"]()),
    )
    fused = FusedLightningModule([DigitsMLP(hidden_dim=8), DigitsMLP(hidden_dim=8)], backend="auto", summary=False)
    fit_digits(make_trainer(max_steps=2), fused)
    fused.stop_trial(0)
    assert fused.backend == "loop"
    checkpoint: dict = {}
    fused.on_save_checkpoint(checkpoint)
    assert checkpoint["lightning_hydro"]["backend"] == "vmap"  # a resumed group that refills goes back to it


class AddOneAtFirstEpochEnd(L.Callback):
    """Records the backend of every batch; at the end of epoch 0 adds ``newcomer``."""

    def __init__(self, newcomer: L.LightningModule) -> None:
        self.newcomer = newcomer
        self.backends: list[str | None] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.backends.append(pl_module.backend)

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == 0:
            pl_module.add_trial(self.newcomer)


def test_auto_runs_a_group_of_one_on_the_loop_untimed_and_times_once_a_second_trial_joins(monkeypatch):
    from lightning_hydro.backends import auto

    sizes: list[int] = []

    def choose(group, candidates, run_step, **kwargs):
        sizes.append(group.size)
        return auto.AutoChoice(dict(candidates)["vmap"]())

    monkeypatch.setattr("lightning_hydro.fused.module.choose_backend", choose)
    trial = seeded(lambda: DigitsMLP(hidden_dim=16, lr=0.1), [3])[0]
    alone = train_separately([trial], fit_digits, max_epochs=1, limit_train_batches=4, limit_val_batches=0)[0]
    probe = AddOneAtFirstEpochEnd(DigitsMLP(hidden_dim=16, lr=0.05))
    fused = FusedLightningModule([trial], backend="auto", max_slots=2, summary=False)
    checkpoint: dict = {}
    fit_digits(make_trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=0), fused)
    assert sizes == []  # one trial: nothing timed
    assert fused.backend == "loop"
    assert fused.results[0]["backend"] == "loop"
    assert max_state_difference(fused.unfuse(0), alone) <= 1e-6  # its own module, its own numbers
    fused.on_save_checkpoint(checkpoint)
    assert checkpoint["lightning_hydro"]["backend"] is None  # untimed: a resumed run decides again
    fit_digits(make_trainer(max_epochs=2, limit_train_batches=4, limit_val_batches=0, callbacks=[probe]), fused)
    assert sizes == [2]  # the newcomer made auto time the candidates, once
    assert probe.backends == ["loop"] * 4 + ["vmap"] * 4
