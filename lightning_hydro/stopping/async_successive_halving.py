"""ASHA: asynchronous successive halving, stopping variant (Li et al., MLSys 2020)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from lightning_hydro.stopping.cutoff import judge_against_quantile, quantile_score, to_score, to_value
from lightning_hydro.stopping.decision import Decision, off_rung_decision, rung_action
from lightning_hydro.stopping.halving_config import (
    HalvingConfig,
    TrialId,
    check_budget,
    check_trial_id,
    check_value,
)
from lightning_hydro.stopping.open_store import StoreSpec, open_store
from lightning_hydro.stopping.rung_record import RungEntry, RungRecord
from lightning_hydro.stopping.rung_store import AppendResult


class TrialReport(NamedTuple):
    """One trial's report: it has trained for ``budget`` units and its monitored value is ``value``."""

    trial_id: TrialId
    budget: int
    value: float


class AsyncSuccessiveHalving:
    """ASHA, stopping variant: judge each trial when it reaches a rung, against the trials before it.

    When a trial reaches a rung milestone its value is recorded there, and the trial stops if the value
    is worse than the ``1 - 1/eta`` quantile of the values recorded at that rung *before* it (see
    :mod:`~lightning_hydro.stopping.cutoff` for the interpolation). The first trial at a rung continues.
    A NaN or infinite value (a diverged trial) stops the trial at any budget. A trial whose budget reaches
    ``max_t`` is ``"complete"``.

    A trial that reaches ``max_t`` is ``"complete"`` whatever its value (unless it diverged).

    :meth:`report_batch` handles simultaneous arrivals, e.g. a fused group whose trials all reach a rung in
    the same epoch: it records them all, then judges each against the quantile of every value recorded at
    the rung up to and including the batch. For a group whose trials start together this is exactly
    synchronous successive halving (keep ``ceil(n/eta)``).

    Records live in a :class:`~lightning_hydro.stopping.rung_store.RungStore`; with a shared one (a SQLite
    file or a database URL) processes that each train one trial apply the rule together. Recording and
    reading the rung happen in one transaction, so the decisions are those of a sequential run in the
    store's arrival order. A report already recorded (same trial, rung and budget: a resumed run replaying
    its epochs) gets the decision it got the first time.

    A report between rungs costs nothing; a report at or past a milestone the trial has not recorded yet
    is one short transaction. A trial past its last recorded milestone that reports again at a larger
    budget before the next milestone gets ``"continue"``/``not_at_rung``.

    Args:
        config: Mode, grace period, reduction factor, max_t.
        store: Where records live: None (memory), a SQLite path, a database URL or a store
            (see :func:`~lightning_hydro.stopping.open_store.open_store`).
        bracket: Which bracket's rungs to use in the store (Hyperband runs one ASHA per bracket).

    Raises:
        StoreSettingsMismatchError: If the store's namespace was used with other settings.

    Example::

        >>> asha = AsyncSuccessiveHalving(HalvingConfig("max", grace_period=1, reduction_factor=2, max_t=4))
        >>> asha.report("a", budget=1, value=0.6).action     # first at rung 1
        'continue'
        >>> asha.report("b", budget=1, value=0.4).describe()
        'trial b: stop at budget 1 (rung 0): value 0.4 is worse than the cutoff 0.6'
        >>> [d.action for d in asha.report_batch([("c", 1, 0.9), ("d", 1, 0.1)])]
        ['continue', 'stop']
        >>> asha.report("a", budget=4, value=0.8).action
        'complete'
    """

    def __init__(self, config: HalvingConfig, store: StoreSpec = None, *, bracket: int = 0) -> None:
        self.config = config
        self.bracket = bracket
        self.store = open_store(store)
        self.store.claim_settings(bracket, config.to_dict())
        # (trial, milestone) -> budget recorded there: saves a transaction per report between rungs.
        self._recorded_budget: dict[tuple[TrialId, int], int] = {}

    def report(self, trial_id: TrialId, budget: int, value: float) -> Decision:
        """Record ``value`` if ``budget`` reaches a new rung for the trial, and decide.

        The cutoff is taken over the values recorded at the rung before this one.
        """
        return self._report([TrialReport(trial_id, budget, value)], batch=False)[0]

    def report_batch(self, reports: Iterable[tuple[TrialId, int, float]]) -> list[Decision]:
        """Record simultaneous reports ``(trial_id, budget, value)`` together, and decide each.

        Trials may be at different rungs (e.g. a refilled slot is behind the others). At each rung, every
        trial of the batch is judged against the values recorded there up to and including the batch.
        Decisions come back in the order of ``reports``.

        Raises:
            ValueError: If a trial appears twice in the batch.
        """
        batch = [TrialReport(*report) for report in reports]
        trial_ids = [report.trial_id for report in batch]
        repeated = sorted({str(t) for t in trial_ids if trial_ids.count(t) > 1})
        if repeated:
            raise ValueError(
                f"AsyncSuccessiveHalving.report_batch: each trial may report once per batch, got {repeated} "
                "more than once. Report one value per trial (its latest)."
            )
        return self._report(batch, batch=True)

    def cutoff(self, milestone: int) -> float | None:
        """The current cutoff at ``milestone`` over all values recorded there (None if none yet)."""
        values = [record.value for record in self.store.records(bracket=self.bracket, milestone=milestone)]
        if not values:
            return None
        scores = [to_score(value, self.config.mode) for value in values]
        return to_value(quantile_score(scores, self.config.reduction_factor), self.config.mode)

    def records(self) -> list[RungRecord]:
        """Every record of this bracket, in arrival order."""
        return self.store.records(bracket=self.bracket)

    def state_dict(self) -> dict[str, Any]:
        """Settings and the store's state (all records for a memory store; the address for shared ones)."""
        return {"config": self.config.to_dict(), "bracket": self.bracket, "store": self.store.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output; later reports decide as an uninterrupted run would.

        Raises:
            ValueError: If the state was saved with other settings.
        """
        if dict(state["config"]) != self.config.to_dict() or state["bracket"] != self.bracket:
            raise ValueError(
                "AsyncSuccessiveHalving.load_state_dict: the checkpoint was made with "
                f"{dict(state['config'])} "
                f"(bracket {state['bracket']}), but this rule has {self.config.to_dict()} (bracket "
                f"{self.bracket}). Resume with the settings the run started with."
            )
        self.store.load_state_dict(state["store"])
        self._recorded_budget.clear()

    def _report(self, reports: list[TrialReport], *, batch: bool) -> list[Decision]:
        where = f"AsyncSuccessiveHalving.{'report_batch' if batch else 'report'}"
        checked = [
            TrialReport(
                check_trial_id(report.trial_id, where=where),
                check_budget(report.budget, where=where),
                check_value(report.value, where=where),
            )
            for report in reports
        ]
        entries: dict[int, RungEntry] = {}
        for position, report in enumerate(checked):
            milestone = self.config.milestone_at_or_below(report.budget)
            if milestone is None:
                continue
            recorded = self._recorded_budget.get((report.trial_id, milestone))
            if recorded is None or recorded == report.budget:  # new at this rung, or a replay
                entries[position] = RungEntry(report.trial_id, self.bracket, milestone, report.budget, report.value)
        result = self.store.append(list(entries.values())) if entries else AppendResult((), (), {})
        stored = dict(zip(entries, result.stored))
        last_of_batch: dict[tuple[int, int], int] = {}
        for stored_record in result.stored:
            self._recorded_budget[(stored_record.trial_id, stored_record.milestone)] = stored_record.budget
            key = stored_record.rung_key
            last_of_batch[key] = max(last_of_batch.get(key, -1), stored_record.sequence)
        decisions = []
        for position, report in enumerate(checked):
            record = stored.get(position)
            if record is None or record.budget != report.budget:  # between rungs, or rung already passed
                decisions.append(self._off_rung_decision(report))
                continue
            # A single report is judged against the records before it; a batch against all up to its last.
            horizon = last_of_batch[record.rung_key] if batch else record.sequence - 1
            population = [r.value for r in result.rungs[record.rung_key] if r.sequence <= horizon]
            decisions.append(self._rung_decision(report, record, population))
        return decisions

    def _rung_decision(self, report: TrialReport, record: RungRecord, population: list[float]) -> Decision:
        config = self.config
        reason, cutoff = judge_against_quantile(record.value, population, config.mode, config.reduction_factor)
        action, reason = rung_action(reason, report.budget, config.max_t)
        return Decision(
            report.trial_id,
            action,
            reason,
            budget=report.budget,
            milestone=record.milestone,
            rung=config.rung_of(record.milestone),
            value=record.value,
            cutoff=cutoff,
        )

    def _off_rung_decision(self, report: TrialReport) -> Decision:
        return off_rung_decision(report.trial_id, report.budget, report.value, self.config.max_t)
