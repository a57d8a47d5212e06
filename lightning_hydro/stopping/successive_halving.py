"""Synchronous successive halving: a cohort of trials reaches each rung together; keep the best 1/eta."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_hydro.stopping.cutoff import judge_against_top_k
from lightning_hydro.stopping.decision import Decision, off_rung_decision, rung_action
from lightning_hydro.stopping.halving_config import (
    AnyTrialId,
    HalvingConfig,
    Rounding,
    TrialId,
    check_budget,
    check_trial_id,
    check_value,
    keep_count,
)
from lightning_hydro.stopping.memory_rung_store import MemoryRungStore
from lightning_hydro.stopping.rung_record import RungEntry, RungRecord


class SuccessiveHalvingRule:
    """Synchronous successive halving (Jamieson and Talwalkar 2016) over one cohort of trials.

    All live trials of the cohort report at the same budget (a fused group trains them in lockstep).
    At each rung milestone, the ``keep_count(n, eta, rounding)`` best of the ``n`` reporting trials
    continue: ``ceil(n / eta)`` by default (the count ASHA's quantile gives a batch, so
    ``AsyncSuccessiveHalving.report_batch`` on the same cohort decides the same), or
    ``max(1, floor(n / eta))`` with ``rounding="floor"``. Trials tied with the last one kept are kept
    too; a diverged trial (NaN or infinite value) is never kept. Trials that reach ``max_t`` are
    complete.

    The first report fixes the cohort. Later reports may only name trials still alive; an alive trial
    missing from a report (e.g. removed as diverged by the fused module) leaves the cohort. With refills
    (new trials joining later), use ASHA's ``report_batch`` instead, which has no cohort.

    Args:
        config: Mode, grace period, reduction factor, max_t.
        rounding: ``"ceil"`` or ``"floor"``
            (see :func:`~lightning_hydro.stopping.halving_config.keep_count`).

    Example::

        >>> halving = SuccessiveHalvingRule(HalvingConfig("min", grace_period=1, reduction_factor=3, max_t=9))
        >>> losses = {trial: 0.1 * trial for trial in range(9)}
        >>> decisions = halving.report_rung(losses, budget=1)
        >>> [trial for trial, decision in decisions.items() if decision.action == "continue"]
        [0, 1, 2]
        >>> halving.report_rung({0: 0.05, 1: 0.02, 2: 0.09}, budget=2)[1].reason   # between rungs
        'not_at_rung'
        >>> [d.action for d in halving.report_rung({0: 0.05, 1: 0.02, 2: 0.09}, budget=3).values()]
        ['stop', 'continue', 'stop']
    """

    def __init__(self, config: HalvingConfig, *, rounding: Rounding = "ceil") -> None:
        keep_count(1, config.reduction_factor, rounding)  # validates rounding
        self.config = config
        self.rounding = rounding
        self._store = MemoryRungStore()
        self._alive: list[TrialId] | None = None
        self._last_milestone: int | None = None

    @property
    def alive(self) -> list[TrialId] | None:
        """The trials still training (None before the first report)."""
        return None if self._alive is None else list(self._alive)

    def report_rung(self, values: Mapping[AnyTrialId, float], budget: int) -> dict[AnyTrialId, Decision]:
        """Report the cohort's values at ``budget``; decide each trial.

        At a budget that reaches a rung not yet decided, the best trials continue and the rest stop.
        Between rungs every finite trial continues. Decisions come back keyed like ``values``.

        Raises:
            ValueError: If a reported trial is not alive in the cohort.
        """
        where = "SuccessiveHalvingRule.report_rung"
        budget = check_budget(budget, where=where)
        for trial in values:
            check_trial_id(trial, where=where)
        checked = {trial: check_value(value, where=where) for trial, value in values.items()}
        if self._alive is not None:
            unknown = [trial for trial in checked if trial not in self._alive]
            if unknown:
                raise ValueError(
                    f"{where}: trials {unknown} are not alive in this cohort (stopped or completed earlier, "
                    f"or never part of it). Report only the alive trials: {self._alive}."
                )
        milestone = self.config.milestone_at_or_below(budget)
        at_new_rung = milestone is not None and (self._last_milestone is None or milestone > self._last_milestone)
        if at_new_rung and milestone is not None:
            decisions = self._decide_rung(checked, budget, milestone)
            self._last_milestone = milestone
        else:
            decisions = {trial: self._between_rungs(trial, value, budget) for trial, value in checked.items()}
        self._alive = [trial for trial, decision in decisions.items() if decision.action == "continue"]
        return decisions

    def records(self) -> list[RungRecord]:
        """The values recorded at each rung, in report order."""
        return self._store.records()

    def state_dict(self) -> dict[str, Any]:
        """Cohort, last rung decided and records."""
        return {
            "config": self.config.to_dict(),
            "rounding": self.rounding,
            "alive": self.alive,
            "last_milestone": self._last_milestone,
            "store": self._store.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output.

        Raises:
            ValueError: If the state was saved with other settings.
        """
        if dict(state["config"]) != self.config.to_dict() or state["rounding"] != self.rounding:
            raise ValueError(
                "SuccessiveHalvingRule.load_state_dict: the checkpoint was made with "
                f"{dict(state['config'])} and "
                f"rounding={state['rounding']!r}, but this rule has {self.config.to_dict()} and "
                f"rounding={self.rounding!r}. Resume with the settings the run started with."
            )
        self._alive = None if state["alive"] is None else list(state["alive"])
        self._last_milestone = state["last_milestone"]
        self._store.load_state_dict(state["store"])

    def _decide_rung(self, values: dict[AnyTrialId, float], budget: int, milestone: int) -> dict[AnyTrialId, Decision]:
        config = self.config
        self._store.append([RungEntry(trial, 0, milestone, budget, value) for trial, value in values.items()])
        keep = keep_count(len(values), config.reduction_factor, self.rounding)
        cohort = list(values.values())
        decisions = {}
        for trial, value in values.items():
            reason, cutoff = judge_against_top_k(value, cohort, config.mode, keep)
            action, reason = rung_action(reason, budget, config.max_t)
            decisions[trial] = Decision(
                trial, action, reason, budget, milestone, config.rung_of(milestone), value, cutoff
            )
        return decisions

    def _between_rungs(self, trial: TrialId, value: float, budget: int) -> Decision:
        return off_rung_decision(trial, budget, value, self.config.max_t)
