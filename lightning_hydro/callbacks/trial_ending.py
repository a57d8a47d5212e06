"""``TrialEnding``: how an early-stopping callback ended one trial, and the summary printed at the end of fit."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from lightning_hydro.stopping import Decision, TrialId, TrialStatus, summarize_budget

__all__ = ["TrialEnding", "format_summary"]


@dataclass(frozen=True)
class TrialEnding:
    """Why and where a callback ended one trial (``HalvingCallback.endings``).

    Attributes:
        trial_id: The trial (a fused slot's trial id, or the process's trial id).
        status: ``"completed"`` (reached ``max_t``), ``"stopped"`` (cut at a rung, by a deadline or by the end of
            fit) or ``"diverged"`` (its monitored value was NaN or infinite).
        budget: Epochs or steps the trial had trained when it ended (counted from when it entered its slot).
        reason: One line for logs and the results table.
        rung: The rung it was stopped or completed at (0 = first), or None if not at a rung.
        bracket: Its Hyperband bracket ``s``, if any.
        value: The monitored value the decision looked at, if any.
    """

    trial_id: TrialId
    status: TrialStatus
    budget: int
    reason: str
    rung: int | None = None
    bracket: int | None = None
    value: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """Plain values, for checkpoints and results."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialEnding:
        """Inverse of :meth:`as_dict`."""
        return cls(**dict(data))

    @classmethod
    def from_decision(
        cls, trial_id: TrialId, decision: Decision, judge: str, monitor: str, max_t: int, bracket: int | None = None
    ) -> TrialEnding:
        """The ending a rule's ``"stop"`` or ``"complete"`` decision gives ``trial_id``.

        Args:
            trial_id: The trial's id in its run (the decision may name it by its id in a shared store).
            decision: The rule's decision.
            judge: Who decided, for the reason (the callback's name).
            monitor: The metric the decision looked at.
            max_t: The budget at which a trial is complete.
            bracket: The trial's Hyperband bracket, if any.

        Example::

            >>> from lightning_hydro.stopping import Decision
            >>> stop = Decision("g/3", "stop", "below_cutoff", budget=3, rung=1, value=0.42, cutoff=0.5)
            >>> TrialEnding.from_decision(3, stop, "ASHA", "val_acc", max_t=9).reason
            'ASHA rung 1 (budget 3): val_acc 0.42 worse than cutoff 0.5'
        """
        if decision.action == "complete":
            reason = f"reached max_t={max_t}"
            return cls(trial_id, "completed", decision.budget, reason, decision.rung, bracket, decision.value)
        if decision.reason == "diverged":
            reason = f"{monitor} is {decision.value} (diverged)"
            return cls(trial_id, "diverged", decision.budget, reason, decision.rung, bracket, decision.value)
        where = judge + (f" bracket {bracket}" if bracket is not None else "")
        reason = (
            f"{where} rung {decision.rung} (budget {decision.budget}): {monitor} {decision.value:.6g} worse than "
            f"cutoff {decision.cutoff:.6g}"
        )
        return cls(trial_id, "stopped", decision.budget, reason, decision.rung, bracket, decision.value)

    @classmethod
    def at_end_of_fit(cls, trial_id: TrialId, budget: int, max_t: int, reason: str) -> TrialEnding:
        """A trial still running when training ends: ``completed`` at ``max_t``, else ``stopped`` for ``reason``."""
        if budget >= max_t:
            return cls(trial_id, "completed", budget, f"reached max_t={max_t}")
        return cls(trial_id, "stopped", budget, reason)


def format_summary(
    rule: str,
    endings: Mapping[TrialId, TrialEnding],
    budgets: Mapping[TrialId, int],
    *,
    max_t: int,
    time_attr: str,
    statuses: Mapping[TrialId, str] | None = None,
) -> str:
    """Two lines: how the trials ended (stopped trials by rung), and the budget spent against ``max_t`` each.

    Args:
        rule: The callback's name.
        endings: How the callback ended trials, by trial.
        budgets: Budget each trial used, for every trial of the run (those still running included).
        max_t: The budget at which a trial is complete.
        time_attr: ``"epochs"`` or ``"steps"``.
        statuses: Each trial's final status where known from elsewhere (a fused module's results, which also
            know the trials it stopped as diverged itself); defaults to the endings' statuses.

    Example::

        >>> endings = {
        ...     0: TrialEnding(0, "stopped", budget=1, reason="ASHA rung 0 (budget 1): ...", rung=0, value=0.9),
        ...     1: TrialEnding(1, "completed", budget=9, reason="reached max_t=9", value=0.2),
        ... }
        >>> print(format_summary("ASHA", endings, {0: 1, 1: 9, 2: 4}, max_t=9, time_attr="epochs",
        ...                      statuses={0: "stopped", 1: "completed", 2: "diverged"}))
        ASHA: 3 trials: 1 completed, 1 stopped (rung 0: 1), 1 diverged.
        Budget: 14 of 27 trial-epochs (51.9%) against training every trial to max_t=9.
    """
    final: dict[TrialId, str] = {tid: endings[tid].status if tid in endings else "running" for tid in budgets}
    final.update(statuses or {})
    counts = Counter(final.values())
    rungs = Counter(
        ending.rung for tid, ending in endings.items() if final.get(tid) == "stopped" and ending.rung is not None
    )
    parts = []
    for status in ("completed", "stopped", "diverged", "running"):
        if counts[status] or status in ("completed", "stopped"):
            text = f"{counts[status]} {status}"
            if status == "stopped" and rungs:
                text += " (" + ", ".join(f"rung {rung}: {n}" for rung, n in sorted(rungs.items())) + ")"
            parts.append(text)
    summary = summarize_budget(dict(budgets), max_t)
    unit = "trial-epochs" if time_attr == "epochs" else "trial-steps"
    return (
        f"{rule}: {len(budgets)} trial{'s' if len(budgets) != 1 else ''}: {', '.join(parts)}.\n"
        f"Budget: {summary.spent} of {summary.exhaustive} {unit} ({summary.fraction:.1%}) against training every "
        f"trial to max_t={max_t}."
    )
