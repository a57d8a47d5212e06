"""HyperSched-style deadline policy (Liaw et al., SoCC 2019): finish the best trials before the deadline.

Stateless: the caller passes the time left and the measured speed each time it asks, so there is
nothing to checkpoint beyond the deadline itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from lightning_hydro.stopping.cutoff import to_score
from lightning_hydro.stopping.decision import Decision
from lightning_hydro.stopping.group_sizing import LinearCost
from lightning_hydro.stopping.halving_config import (
    HalvingConfig,
    TrialId,
    check_budget,
    check_trial_id,
    check_value,
)

SecondsPerUnit = float | LinearCost
"""Seconds a group needs to advance every trial in it by one unit of budget (epoch or step): a constant,
or a :class:`~lightning_hydro.stopping.group_sizing.LinearCost` of the group size (a fused group steps
faster with fewer trials)."""


@dataclass(frozen=True)
class TrialProgress:
    """Where a live trial stands: ``budget`` units trained, latest monitored ``value`` (None if none yet)."""

    trial_id: TrialId
    budget: int
    value: float | None = None


@dataclass(frozen=True)
class DeadlinePlan:
    """What :meth:`DeadlinePolicy.plan` decided.

    Attributes:
        keep: The trials to keep training, best first.
        stop: A ``"stop"`` decision for each other trial (reason ``cannot_finish_before_deadline``, or
            ``diverged``).
        admit_new_trials: Whether a free slot may be refilled: a new trial could still reach the top rung
            in time, alongside the kept ones.
        seconds_needed: Predicted seconds for the kept group to bring every kept trial to the top rung.
    """

    keep: tuple[TrialId, ...]
    stop: tuple[Decision, ...]
    admit_new_trials: bool
    seconds_needed: float


class DeadlinePolicy:
    """Admission and pruning so that the best trials reach the top rung before a deadline.

    *Admission*: start a new trial only if it can reach the top rung (the last milestone) in the time
    left, given the measured seconds per unit of budget. *Near the deadline*: keep the trials that can
    still reach the top rung, choosing greedily from the best down (a trial is kept if, with it, every
    kept trial still finishes in time at the group's new size); stop the rest, so the survivors step
    faster in the freed capacity. The best trial is never stopped for lack of time: if no trial can
    finish, it alone trains on to the deadline. Diverged trials always stop.

    "Best" ranks trials by their latest value (the mode decides the direction), trials without a value
    after those with one, then by budget (further along first), then by the order given.

    Args:
        config: Gives the mode and the top rung (``config.top_milestone``).

    Example::

        >>> policy = DeadlinePolicy(HalvingConfig("max", grace_period=1, reduction_factor=3, max_t=9))
        >>> policy.admits_new_trial(time_left_s=100.0, seconds_per_unit=10.0)   # needs 9 * 10 s
        True
        >>> trials = [TrialProgress("a", 3, 0.8), TrialProgress("b", 5, 0.7), TrialProgress("c", 1, 0.9)]
        >>> speed = LinearCost(fixed=2.0, per_trial=4.0)       # a group of B trials: 2 + 4 B s per epoch
        >>> plan = policy.plan(trials, time_left_s=100.0, seconds_per_unit=speed)
        >>> plan.keep, [d.trial_id for d in plan.stop], plan.admit_new_trials   # c+a: 8 * (2 + 4*2) = 80 s
        (('c', 'a'), ['b'], False)
    """

    def __init__(self, config: HalvingConfig) -> None:
        self.config = config

    def seconds_to_top_rung(self, budget: int, seconds_per_unit: SecondsPerUnit, *, group_size: int = 1) -> float:
        """Seconds a trial at ``budget`` needs to reach the top rung in a group of ``group_size``."""
        remaining = max(0, self.config.top_milestone - budget)
        return remaining * _seconds_per_unit(seconds_per_unit, group_size)

    def admits_new_trial(self, time_left_s: float, seconds_per_unit: SecondsPerUnit, *, group_size: int = 1) -> bool:
        """Whether a trial starting now (budget 0) reaches the top rung in ``time_left_s``.

        ``group_size`` is the size of its group once it has joined (1 for one trial per process).
        """
        _check_time_left(time_left_s)
        return self.seconds_to_top_rung(0, seconds_per_unit, group_size=group_size) <= time_left_s

    def plan(
        self, trials: Sequence[TrialProgress], time_left_s: float, seconds_per_unit: SecondsPerUnit
    ) -> DeadlinePlan:
        """Choose which live trials keep training and whether free slots may be refilled."""
        _check_time_left(time_left_s)
        where = "DeadlinePolicy.plan"
        for trial in trials:
            check_trial_id(trial.trial_id, where=where)
            check_budget(trial.budget, where=where)
            if trial.value is not None:
                check_value(trial.value, where=where)
        trial_ids = [trial.trial_id for trial in trials]
        repeated = sorted({str(t) for t in trial_ids if trial_ids.count(t) > 1})
        if repeated:
            raise ValueError(
                f"{where}: each trial may appear once, got {repeated} more than once. Pass each live trial's "
                "latest progress."
            )
        diverged = [t for t in trials if t.value is not None and not math.isfinite(t.value)]
        ranked = sorted(
            (t for t in trials if t not in diverged),
            key=lambda t: self._rank_key(t, trial_ids.index(t.trial_id)),
        )
        kept: list[TrialProgress] = []
        for trial in ranked:
            if self._group_seconds([*kept, trial], seconds_per_unit) <= time_left_s:
                kept.append(trial)
        if not kept and ranked:
            kept = [ranked[0]]
        stop = [
            Decision(t.trial_id, "stop", "cannot_finish_before_deadline", t.budget, value=t.value)
            for t in ranked
            if t not in kept
        ]
        stop += [Decision(t.trial_id, "stop", "diverged", t.budget, value=t.value) for t in diverged]
        newcomer = TrialProgress(trial_id="<new>", budget=0)
        admit = self._group_seconds([*kept, newcomer], seconds_per_unit) <= time_left_s
        return DeadlinePlan(
            keep=tuple(t.trial_id for t in kept),
            stop=tuple(stop),
            admit_new_trials=admit,
            seconds_needed=self._group_seconds(kept, seconds_per_unit),
        )

    def _group_seconds(self, group: Sequence[TrialProgress], seconds_per_unit: SecondsPerUnit) -> float:
        """Seconds until every trial of ``group``, stepping together, reaches the top rung."""
        if not group:
            return 0.0
        furthest = min(trial.budget for trial in group)
        return self.seconds_to_top_rung(furthest, seconds_per_unit, group_size=len(group))

    def _rank_key(self, trial: TrialProgress, position: int) -> tuple[int, float, int, int]:
        score = None if trial.value is None else to_score(trial.value, self.config.mode)
        return (score is None, -float(score or 0), -trial.budget, position)


def _seconds_per_unit(seconds_per_unit: SecondsPerUnit, group_size: int) -> float:
    seconds = seconds_per_unit.predict(group_size) if isinstance(seconds_per_unit, LinearCost) else seconds_per_unit
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(
            "DeadlinePolicy: seconds per unit of budget must be a finite number > 0 (for a group of "
            f"{group_size}), "
            f"got {seconds!r}. Pass the measured time of one epoch (or step), or a LinearCost fitted to it."
        )
    return float(seconds)


def _check_time_left(time_left_s: float) -> None:
    if math.isnan(time_left_s):
        raise ValueError("DeadlinePolicy: time_left_s is NaN. Pass the seconds left until the deadline.")
