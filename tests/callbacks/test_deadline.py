"""Deadline (HyperSched) in a real Trainer, on a simulated clock: every training batch of a group of B trials
takes 1 + B seconds, so an epoch of 3 batches takes 3 + 3 B seconds."""

from __future__ import annotations

import datetime

import lightning as L
import pytest
from lightning.pytorch.callbacks import Callback

from lightning_hydro import FusedLightningModule
from lightning_hydro.callbacks import Deadline
from tests.callbacks.trials import LEARNING_RATES, fit, fused, mlp, mlps

START = 1_000_000.0


class FakeClock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


class Tick(Callback):
    """Advances the clock after each training batch as if the group's step cost 1 + B seconds."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: object) -> None:
        size = len(pl_module.trial_ids) if isinstance(pl_module, FusedLightningModule) else 1
        self.clock.now += 1.0 + size


def test_near_the_deadline_only_the_best_trial_goes_on_and_no_slot_is_refilled():
    clock = FakeClock()
    module = fused(LEARNING_RATES[:6])
    callback = Deadline("val_loss", deadline=50.0, max_t=3, clock=clock, refill=mlps([0.1, 0.2]))
    fit(module, [Tick(clock), callback], max_epochs=3)

    # epoch 1 with 6 trials took 21 s (measured); ASHA keeps 2 of 6; both would need 2 more epochs at 21 s but
    # only 29 s are left: the best goes on alone, and no new trial could reach the top rung in time
    assert callback.measurements[0] == (6, 21.0)
    statuses = {tid: (r["status"], r["epochs"], r["reason"]) for tid, r in module.results.items()}
    assert sorted(statuses) == list(range(6))
    assert callback._refill.drawn == 0
    by_deadline = [t for t, (_, _, reason) in statuses.items() if reason.startswith("cannot reach the top rung")]
    completed = [t for t, (status, epochs, _) in statuses.items() if status == "completed" and epochs == 3]
    assert len(by_deadline) == 1
    assert len(completed) == 1
    best, second = completed[0], by_deadline[0]
    assert module.results[best]["history"][0]["val_loss"] <= module.results[second]["history"][0]["val_loss"]
    assert clock.now - START == 21.0 + 2 * 6.0  # the lone survivor's epochs took 3 + 3 * 1 seconds
    assert callback.time_left() > 0


def test_with_time_to_spare_it_decides_as_asha_and_refills():
    clock = FakeClock()
    module = fused(LEARNING_RATES[:3])
    callback = Deadline("val_loss", deadline=datetime.timedelta(hours=1), max_t=3, clock=clock, refill=mlps([0.1]))
    fit(module, [Tick(clock), callback], max_epochs=3)
    assert callback._refill.drawn == 1
    assert 3 in module.results
    assert [r["status"] for r in module.results.values()].count("completed") == 1


def test_when_the_deadline_passes_training_stops_and_running_trials_are_stopped():
    clock = FakeClock()
    module = fused(LEARNING_RATES[:2])
    callback = Deadline("val_loss", deadline=15.0, max_t=3, clock=clock)
    trainer = fit(module, [Tick(clock), callback], max_epochs=3)
    # epoch 1: 9 s; the best trial goes on alone at 2 s per batch and the deadline passes after 3 more batches
    assert trainer.current_epoch < 3
    survivor = [r for r in module.results.values() if r["epochs"] == 2]
    assert len(survivor) == 1
    assert survivor[0]["status"] == "stopped"
    assert survivor[0]["reason"].startswith("deadline reached")


def test_one_trial_per_process_that_cannot_finish_before_the_deadline_stops(tmp_path):
    clock = FakeClock()
    at = datetime.datetime.fromtimestamp(START + 10.0)
    callback = Deadline("val_loss", deadline=at, max_t=3, clock=clock, storage=str(tmp_path / "d.db"))
    trainer = fit(mlp(0.1), [Tick(clock), callback], max_epochs=3)
    # one epoch took 6 s; two more would end at 18 s, after the deadline at 10 s
    assert (callback.status, trainer.current_epoch) == ("stopped", 1)
    assert callback.result["reason"] == "cannot reach the top rung before the deadline"


@pytest.mark.parametrize("deadline", [0, -5.0, float("nan"), True, "1h", datetime.timedelta(seconds=0)])
def test_deadline_must_be_a_positive_duration(deadline):
    with pytest.raises(ValueError, match=r"Deadline: deadline must be a duration > 0 \(seconds or a timedelta\)"):
        Deadline("val_loss", deadline=deadline)


def test_deadline_in_the_past_and_clock_are_checked():
    clock = FakeClock()
    with pytest.raises(ValueError, match=r"Deadline: the deadline .* is in the past\. Pass a later time"):
        Deadline("val_loss", deadline=datetime.datetime.fromtimestamp(START - 1), clock=clock)
    with pytest.raises(TypeError, match=r"Deadline: clock must be a function returning seconds, got float"):
        Deadline("val_loss", deadline=60, clock=1.0)
