"""``ProcessTrial``: the one trial an ordinary LightningModule trains in this process, as a callback sees it.

The Trainer trains one trial, so the view counts the epochs it trains (nothing else counts them from when the
trial started, across a resume); stopping the trial ends ``fit`` normally.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning as L
from typing_extensions import override

from lightning_hydro.callbacks.callback_arguments import monitor_error
from lightning_hydro.callbacks.trial_ending import TrialEnding
from lightning_hydro.callbacks.trials_view import TrialsView
from lightning_hydro.stopping import TimeAttr, TrialId, TrialStatus

__all__ = ["ProcessTrial"]


class ProcessTrial(TrialsView):
    """The one trial an ordinary LightningModule trains in this process.

    Attributes:
        together: False: the trial is judged alone, against what the other processes recorded.
        takes_new_trials: False: the sweep starts the next trial in its own process.
        status: How the trial stands: ``"running"`` until a decision or the end of fit ends it.

    Args:
        trainer: The Trainer that fits the trial.
        key: The trial's id in the rule's shared store.
        monitor: The metric that ranks trials.
        owner: The callback's name, for error messages.
        time_attr: What a budget counts.
    """

    def __init__(self, trainer: L.Trainer, key: TrialId, monitor: str, owner: str, time_attr: TimeAttr) -> None:
        self.trainer = trainer
        self.key = key
        self.monitor = monitor
        self.owner = owner
        self.time_attr: TimeAttr = time_attr
        self.together = False
        self.takes_new_trials = False
        self.status: TrialStatus = "running"
        self.epochs = 0  # epochs trained in this run: the trial's budget in epochs
        # The index of the last epoch counted. An index, not a flag reset at epoch start: a fit resumed from a
        # checkpoint written after an epoch's last batch starts the next epoch without on_train_epoch_start.
        self.counted_epoch = -1

    @override
    def running(self) -> list[TrialId]:
        return [self.key] if self.status == "running" else []

    @override
    def rule_key(self, trial_id: TrialId) -> TrialId:
        return trial_id

    @override
    def budget(self, trial_id: TrialId) -> int:
        return self.epochs if self.time_attr == "epochs" else int(self.trainer.global_step)

    @override
    def values(self, *, epoch_end: bool) -> dict[TrialId, float | None]:
        metrics = self.trainer.callback_metrics
        if self.monitor not in metrics:
            raise monitor_error(self.owner, self.monitor, self.trainer, sorted(metrics), per_trial=False)
        return {self.key: float(metrics[self.monitor])} if self.status == "running" else {}

    @override
    def stop(self, ending: TrialEnding) -> None:
        self.status = ending.status
        self.trainer.should_stop = True

    @override
    def units_done(self) -> int:
        return self.budget(self.key)

    @override
    def batch_ended(self, batch_idx: int) -> None:
        if batch_idx + 1 >= self.trainer.num_training_batches:
            self.epoch_ended()  # before validation, so that its decision sees the epoch

    @override
    def epoch_ended(self) -> None:
        if self.counted_epoch != self.trainer.current_epoch:
            self.epochs += 1
            self.counted_epoch = self.trainer.current_epoch

    @override
    def sanity_check_ended(self) -> None:
        """Nothing to check: a plain module's metrics are Lightning's ``callback_metrics``."""

    @override
    def train_started(self) -> None:
        if self.status != "running":
            self.trainer.should_stop = True  # resumed after this trial had already ended

    @override
    def free_slots(self) -> int:
        return 0  # the sweep starts the next trial in its own process

    @override
    def add(self, module: L.LightningModule, trial_id: int | None) -> TrialId:
        raise RuntimeError(f"{self.owner}: one trial per process has no slot for another trial.")

    @override
    def ended(self) -> tuple[dict[TrialId, int], dict[TrialId, str]]:
        return {self.key: self.budget(self.key)}, {self.key: self.status}

    @override
    def final_result(self, endings: Mapping[TrialId, TrialEnding]) -> dict[str, Any]:
        ending = endings[self.key]
        return {
            "trial_id": self.key,
            "status": self.status,
            "budget": self.budget(self.key),
            "epochs": self.epochs,
            "steps": self.trainer.global_step,
            "metrics": {name: float(value) for name, value in self.trainer.callback_metrics.items()},
            "reason": ending.reason,
            "rung": ending.rung,
        }

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "trial_key": self.key,
            "epochs": self.epochs,
            "counted_epoch": self.counted_epoch,
            "status": self.status,
        }

    @override
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.key = state["trial_key"]
        self.epochs = int(state["epochs"])
        self.counted_epoch = int(state["counted_epoch"])
        self.status = state["status"]
