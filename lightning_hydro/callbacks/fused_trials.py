"""``FusedTrials``: the trials of a :class:`~lightning_hydro.FusedLightningModule`, as a callback sees them.

Budgets are the module's own per-trial counts (read from its live records, not copied); stopping a trial frees
its slot, and free slots take new trials.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning as L
from typing_extensions import override

from lightning_hydro.callbacks.callback_arguments import monitor_error
from lightning_hydro.callbacks.trial_ending import TrialEnding
from lightning_hydro.callbacks.trials_view import TrialsView
from lightning_hydro.fused import FusedLightningModule
from lightning_hydro.stopping import TimeAttr, TrialId, TrialStatus

__all__ = ["FusedTrials"]


class FusedTrials(TrialsView):
    """The trials of a fused group.

    Attributes:
        together: True: the trials reporting at one point are judged together.
        takes_new_trials: True: freed slots take new trials.
        status: Always ``"running"``: each trial's status is in the module's ``results``.

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
        self.takes_new_trials = True
        self.status: TrialStatus = "running"
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
    def stop(self, ending: TrialEnding) -> None:
        if ending.trial_id in self.module.trial_ids:
            self.module.stop_trial(int(ending.trial_id), ending.reason, status=ending.status)

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
    def final_result(self, endings: Mapping[TrialId, TrialEnding]) -> dict[str, Any]:
        return {}  # each trial's result is the module's ``results[id]``

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"prefix": self.prefix, "monitor_seen": self.monitor_seen}

    @override
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.prefix = state["prefix"]
        self.monitor_seen = bool(state["monitor_seen"])
