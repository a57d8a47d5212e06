"""What an early-stopping callback sees of the trials it judges: a fused group, or the one trial of this process.

:class:`~lightning_hydro.callbacks.halving_callback.HalvingCallback` asks a :class:`TrialsView` for the running
trials, their budgets and monitored values, and hands it the trials to stop; it never asks which kind of run it
is in. Two implementations:

- :class:`FusedTrials`: the trials of a :class:`~lightning_hydro.FusedLightningModule`. Budgets are the module's
  own per-trial counts (read from its live records, not copied); stopping a trial frees its slot, and free slots
  take new trials.
- :class:`ProcessTrial`: an ordinary LightningModule, one trial per process. The Trainer trains one trial, so the
  view counts the epochs it trains (nothing else does); stopping the trial ends ``fit`` normally.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import lightning as L
from typing_extensions import override

from lightning_hydro.callbacks.trial_outcome import TrialOutcome
from lightning_hydro.fused import FusedLightningModule
from lightning_hydro.schedulers import TimeAttr, TrialId, TrialStatus

__all__ = ["FusedTrials", "ProcessTrial", "TrialsView", "monitor_error"]


class TrialsView(Protocol):
    """The trials a callback judges, whatever trains them."""

    together: bool
    """Whether the trials reporting at one decision point are judged together (a fused group)."""

    def running(self) -> list[TrialId]:
        """The running trials' ids (the ids outcomes and results name)."""
        ...

    def rule_key(self, trial_id: TrialId) -> TrialId:
        """The id under which the rule (and its shared store) knows the trial."""
        ...

    def budget(self, trial_id: TrialId) -> int:
        """Epochs or steps the trial has trained since it entered the run."""
        ...

    def values(self, *, epoch_end: bool) -> dict[TrialId, float | None]:
        """Each running trial's latest monitored value; ``epoch_end``: at the end of a training epoch.

        Raises:
            RuntimeError: If the trials do not log ``monitor`` at all.
        """
        ...

    def stop(self, outcome: TrialOutcome) -> None:
        """End one running trial."""
        ...

    def units_done(self) -> int:
        """Budget units the run has trained so far (for timing them)."""
        ...

    def batch_ended(self, batch_idx: int) -> None:
        """A training batch ended (before the module's own ``on_train_batch_end``)."""
        ...

    def epoch_ended(self) -> None:
        """A training epoch ended."""
        ...

    def sanity_check_ended(self) -> None:
        """Lightning's sanity check (a short validation before training) ended."""
        ...

    def train_started(self) -> None:
        """Training starts (or resumes)."""
        ...

    def free_slots(self) -> int:
        """How many new trials the run can take now."""
        ...

    def add(self, module: L.LightningModule, trial_id: int | None) -> TrialId:
        """Start a new trial in a free slot; returns its id."""
        ...

    def ended(self) -> tuple[dict[TrialId, int], dict[TrialId, str]]:
        """At the end of fit: the budget and status of every trial of the run."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs to resume the view."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        ...


class FusedTrials(TrialsView):
    """The trials of a fused group.

    Attributes:
        together: True: the trials reporting at one point are judged together.

    Args:
        trainer: The Trainer that fits the group.
        module: The fused module.
        monitor: The metric that ranks trials.
        owner: The callback's name, for error messages.
        time_attr: What a budget counts.
        prefix: With shared storage, the prefix of the group's trial ids in the rule (``"{prefix}/{id}"``).
    """

    def __init__(
        self,
        trainer: L.Trainer,
        module: FusedLightningModule,
        monitor: str,
        owner: str,
        time_attr: TimeAttr,
        prefix: str | None,
    ) -> None:
        self.trainer = trainer
        self.module = module
        self.monitor = monitor
        self.owner = owner
        self.time_attr: TimeAttr = time_attr
        self.prefix = prefix
        self.together = True
        module.count_budget_in(time_attr)  # results[...]["budget"] in the unit this callback counts
        self.monitor_seen = False
        self.sanity_checked = False  # the sanity check logged names (the module then knows what it logs)

    @override
    def running(self) -> list[TrialId]:
        return list(self.module.trial_ids)

    @override
    def rule_key(self, trial_id: TrialId) -> TrialId:
        return trial_id if self.prefix is None else f"{self.prefix}/{trial_id}"

    @override
    def budget(self, trial_id: TrialId) -> int:
        return self.module.trial_record(int(trial_id)).budget

    @override
    def values(self, *, epoch_end: bool) -> dict[TrialId, float | None]:
        monitor = self.monitor
        if epoch_end:  # the module publishes the epoch's values after this hook: read them from it now
            latest = self.module.training_epoch_values()
        else:
            latest = {tid: self.module.trial_record(tid).metrics for tid in self.module.trial_ids}
        values: dict[TrialId, float | None] = {tid: metrics.get(monitor) for tid, metrics in latest.items()}
        if any(value is not None for value in values.values()):
            self.monitor_seen = True
        elif values and not self.monitor_seen:
            logged = sorted({name for metrics in latest.values() for name in metrics})
            raise monitor_error(self.owner, monitor, self.trainer, logged, per_trial=True)
        return values

    @override
    def stop(self, outcome: TrialOutcome) -> None:
        if outcome.trial_id in self.module.trial_ids:
            self.module.stop_trial(int(outcome.trial_id), outcome.reason, status=outcome.status)

    @override
    def units_done(self) -> int:
        # Between two decisions the trials still running all trained the same units; the furthest shows them.
        if self.time_attr == "steps":
            return int(self.trainer.global_step)
        return max((self.budget(tid) for tid in self.module.trial_ids), default=0)

    @override
    def batch_ended(self, batch_idx: int) -> None:
        """Raise now if the trials cannot log ``monitor``, not at the first rung, after every trial trained.

        A fused module knows every name its trials log once its training step and (in the sanity check) its
        validation step have run; without a sanity check, the validation step's names come at the first rung.
        """
        if self.monitor_seen:
            return
        logged = self.module.logged_names
        if self.monitor in logged:
            self.monitor_seen = True
        elif self.sanity_checked or not self.trainer.enable_validation:
            raise monitor_error(
                self.owner,
                self.monitor,
                self.trainer,
                sorted(logged),
                per_trial=True,
                when="the sanity check and the first training batch",
            )

    @override
    def epoch_ended(self) -> None:
        """Nothing to count: the module counts each trial's epochs."""

    @override
    def sanity_check_ended(self) -> None:
        # a module that logs nothing in the sanity check may skip logging there on purpose: no verdict
        logged = self.module.logged_names
        self.sanity_checked = bool(logged)
        self.monitor_seen = self.monitor_seen or self.monitor in logged

    @override
    def train_started(self) -> None:
        """Nothing to do: the module restores its trials."""

    @override
    def free_slots(self) -> int:
        return self.module.free_slots

    @override
    def add(self, module: L.LightningModule, trial_id: int | None) -> TrialId:
        return self.module.add_trial(module, trial_id)  # in eval mode if added during validation

    @override
    def ended(self) -> tuple[dict[TrialId, int], dict[TrialId, str]]:
        results = self.module.results
        budgets: dict[TrialId, int] = {tid: result["budget"] for tid, result in results.items()}
        return budgets, {tid: result["status"] for tid, result in results.items()}

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "monitor_seen": self.monitor_seen}

    @override
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.prefix = state["prefix"]
        self.monitor_seen = bool(state["monitor_seen"])


class ProcessTrial(TrialsView):
    """The one trial an ordinary LightningModule trains in this process.

    Attributes:
        together: False: the trial is judged alone, against what the other processes recorded.
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
    def stop(self, outcome: TrialOutcome) -> None:
        self.status = outcome.status
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

    def result(self, outcome: TrialOutcome) -> dict[str, Any]:
        """The trial's result at the end of fit (``HalvingCallback.result``)."""
        return {
            "trial_id": self.key,
            "status": self.status,
            "budget": self.budget(self.key),
            "epochs": self.epochs,
            "steps": self.trainer.global_step,
            "metrics": {name: float(value) for name, value in self.trainer.callback_metrics.items()},
            "reason": outcome.reason,
            "rung": outcome.rung,
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


def monitor_error(
    owner: str, monitor: str, trainer: L.Trainer, logged: list[str], *, per_trial: bool, when: str | None = None
) -> RuntimeError:
    """The error for a ``monitor`` the trials do not log: what is logged instead, and the fix."""
    where = "by any trial of the fused module" if per_trial else "in trainer.callback_metrics"
    shown = ", ".join(repr(name) for name in logged) if logged else "nothing"
    first = "validation" if trainer.enable_validation else "training epoch"
    when_text = f"after {when}" if when else f"at the end of the first {first}"
    hint = (
        " Pass the name the trial modules give self.log, without the '/trial_{id}' suffix."
        if per_trial
        else " Pass one of these, or log the metric in validation_step (or training_step without validation)."
    )
    return RuntimeError(
        f"{owner}(monitor={monitor!r}): the monitor is not logged {where} {when_text}; logged: {shown}.{hint}"
    )
