"""A trial's own hook that sets ``self.trainer.should_stop`` stops that trial, as it ends its run alone.

Before (until 2026-12-02) it ended the whole group's fit: every other trial trained less than alone, silently (in the
second test, the trial that never asks to stop trained 1 epoch instead of 6). Now the group stops the asking trial
when its hooks of the batch, the epoch or the validation run are done (``fused/lightning/trainer_view.py``,
``TrialStopRequests``), after ``Trainer(min_epochs=...)`` as alone, and the others go on.
"""

from __future__ import annotations

import copy
from typing import Any

import lightning as L
import pytest
import torch

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsMLP
from tests.helpers import fit_digits, make_trainer, max_state_difference, seeded

FIT = dict(max_epochs=6, limit_train_batches=3, limit_val_batches=2)


class StopsAtTarget(DigitsMLP):
    """Published custom early stopping: stop once the validation loss is under a target (per trial)."""

    def __init__(self, target: float, **kwargs: Any) -> None:
        super().__init__(hidden_dim=16, **kwargs)
        self.target = target

    def on_validation_epoch_end(self) -> None:
        if self.trainer.callback_metrics["val_loss"] < self.target:
            self.trainer.should_stop = True


class StopsAfterSteps(DigitsMLP):
    """Stops within an epoch, from ``on_train_batch_end``, and counts its epoch ends."""

    def __init__(self, stop_at: int, **kwargs: Any) -> None:
        super().__init__(hidden_dim=16, **kwargs)
        self.stop_at = stop_at
        self.epoch_ends = 0

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.global_step >= self.stop_at:
            self.trainer.should_stop = True
            assert self.trainer.should_stop  # it reads its request back, as alone

    def on_train_epoch_end(self) -> None:
        self.epoch_ends += 1


def _alone(trials: list[L.LightningModule], **kwargs: Any) -> list[tuple[L.LightningModule, int]]:
    runs = []
    for trial in trials:
        module = copy.deepcopy(trial)
        trainer = make_trainer(**{**FIT, **kwargs})
        torch.manual_seed(1234)
        fit_digits(trainer, module)
        runs.append((module, trainer.global_step))
    return runs


def _fused(trials: list[L.LightningModule], backend: str, **kwargs: Any) -> FusedLightningModule:
    fused = FusedLightningModule([copy.deepcopy(t) for t in trials], backend=backend, summary=False)
    torch.manual_seed(1234)
    fit_digits(make_trainer(**{**FIT, **kwargs}), fused)
    return fused


@pytest.mark.parametrize("backend", ["loop", "vmap"])
def test_a_trial_that_stops_itself_in_its_validation_hook_stops_alone_the_others_go_on(backend: str) -> None:
    targets = iter([2.295, 0.0, 2.4])  # stops after a few epochs, never, at once
    trials = seeded(lambda: StopsAtTarget(next(targets), lr=0.05), [0, 1, 2])
    alone = _alone(trials)
    assert len({steps for _, steps in alone}) == 3  # the three stop at different steps alone
    fused = _fused(trials, backend)
    for tid, (module, steps) in enumerate(alone):
        assert fused.results[tid]["steps"] == steps
        assert max_state_difference(fused.unfuse(tid), module) <= (0.0 if backend == "loop" else 1e-5)
    assert fused.results[1]["status"] == "completed"
    assert "on_validation_epoch_end set trainer.should_stop" in fused.results[0]["reason"]


@pytest.mark.parametrize("min_epochs", [None, 3])
def test_a_stop_within_an_epoch_ends_the_trial_as_alone_and_waits_for_min_epochs(min_epochs: int | None) -> None:
    stops = iter([4, 100, 7])
    trials = seeded(lambda: StopsAfterSteps(next(stops), lr=0.05), [0, 1, 2])
    kwargs = {} if min_epochs is None else {"min_epochs": min_epochs}
    alone = _alone(trials, **kwargs)
    if min_epochs is None:  # within an epoch: alone, Lightning validates once more; fused, a warning says it did not
        with pytest.warns(UserWarning, match=r"would validate each once more"):
            fused = _fused(trials, "loop", **kwargs)
    else:  # the stops wait for the third epoch's end, where a trial leaves as alone
        fused = _fused(trials, "loop", **kwargs)
    for tid, (module, steps) in enumerate(alone):
        trained = fused.unfuse(tid)
        assert fused.results[tid]["steps"] == steps
        assert trained.epoch_ends == module.epoch_ends  # its on_train_epoch_end ran for the epoch it stopped in
        assert max_state_difference(trained, module) == 0.0


def test_a_stop_set_in_a_hook_run_once_for_every_trial_ends_the_group() -> None:
    """A hook run once for all trials (a batch-transfer hook) stands for every trial: the whole fit ends."""

    class StopsInTransfer(DigitsMLP):
        def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
            if self.trainer.training and self.trainer.global_step >= 2:
                self.trainer.should_stop = True
            return batch

    trials = seeded(lambda: StopsInTransfer(hidden_dim=16, lr=0.05), [0, 1])
    fused = _fused(trials, "loop")
    assert {fused.results[tid]["steps"] for tid in (0, 1)} == {3}  # as each alone: the stop ends the epoch's loop
    assert fused.trainer.should_stop


def test_a_request_still_waiting_for_min_epochs_when_the_fit_ends_is_gone_in_the_next_fit() -> None:
    trials = seeded(lambda: StopsAfterSteps(1, lr=0.05), [0, 1])
    fused = FusedLightningModule(trials, backend="loop", summary=False)
    fit_digits(make_trainer(max_epochs=1, min_epochs=2, limit_train_batches=3, limit_val_batches=0), fused)
    assert fused.trial_ids == [0, 1]  # min_epochs=2 was never reached: the stops wait, as alone
    for tid in (0, 1):
        fused.trial_module(tid).stop_at = 10**6  # the next fit's hooks ask nothing
    fit_digits(make_trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=0), fused)
    assert [fused.results[tid]["steps"] for tid in (0, 1)] == [6, 6]  # both trained the second fit through


class StopsAtAnEpochsStart(DigitsMLP):
    def __init__(self, epoch: int, **kwargs: Any) -> None:
        super().__init__(hidden_dim=16, **kwargs)
        self.epoch = epoch

    def on_train_epoch_start(self) -> None:
        if self.current_epoch == self.epoch:
            self.trainer.should_stop = True


def test_a_stop_asked_at_an_epochs_start_trains_no_batch_of_it_as_alone() -> None:
    epochs = iter([2, 99])
    trials = seeded(lambda: StopsAtAnEpochsStart(next(epochs), lr=0.05), [0, 1])
    alone = _alone(trials, limit_val_batches=0)
    fused = _fused(trials, "loop", limit_val_batches=0)
    assert [steps for _, steps in alone] == [6, 18]
    for tid, (module, steps) in enumerate(alone):
        assert fused.results[tid]["steps"] == steps
        assert max_state_difference(fused.unfuse(tid), module) == 0.0
