"""What a rule tells the caller to do with one trial, and why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lightning_hydro.stopping.halving_config import TrialId, is_diverged

Action = Literal["continue", "stop", "complete"]
"""``"continue"`` training, ``"stop"`` now (free the slot), or ``"complete"``: the trial reached ``max_t``."""

Reason = Literal[
    "not_at_rung",
    "first_at_rung",
    "at_or_above_cutoff",
    "below_cutoff",
    "diverged",
    "reached_max_t",
    "cannot_finish_before_deadline",
]
"""Why a decision was taken.

- ``not_at_rung``: the budget is not at a new rung milestone; nothing was recorded.
- ``first_at_rung``: no value was recorded at the rung before this trial's, so there is no cutoff yet.
- ``at_or_above_cutoff`` / ``below_cutoff``: the value is at least as good as / worse than the cutoff.
- ``diverged``: the value is NaN or infinite; a diverged trial always stops.
- ``reached_max_t``: the budget reached ``max_t``.
- ``cannot_finish_before_deadline``: a deadline policy stopped the trial (it cannot reach the top rung
  in the time left, or better trials need its capacity).
"""


@dataclass(frozen=True)
class Decision:
    """One decision about one trial.

    Attributes:
        trial_id: The trial decided about.
        action: ``"continue"``, ``"stop"`` or ``"complete"``.
        reason: Why (see :data:`Reason`); ``"diverged"`` is what a callback reports as status *diverged*.
        budget: The budget the trial reported.
        milestone: The rung milestone the value was recorded at, or None if nothing was recorded.
        rung: The index of that rung in the rule's milestones (0 = first rung), or None.
        value: The value reported, or None if the rule did not look at one.
        cutoff: The value the trial had to match, in the monitored metric's units (lower is better in
            ``"min"`` mode), or None when no cutoff applied.

    Example::

        >>> decision = Decision(7, "stop", "below_cutoff", 3, milestone=3, rung=1, value=0.9, cutoff=0.5)
        >>> decision.stopped, decision.describe()
        (True, 'trial 7: stop at budget 3 (rung 1): value 0.9 is worse than the cutoff 0.5')
    """

    trial_id: TrialId
    action: Action
    reason: Reason
    budget: int
    milestone: int | None = None
    rung: int | None = None
    value: float | None = None
    cutoff: float | None = None

    @property
    def stopped(self) -> bool:
        """True when the caller must stop the trial now."""
        return self.action == "stop"

    def describe(self) -> str:
        """One line for logs and summaries."""
        where = f"budget {self.budget}" + (f" (rung {self.rung})" if self.rung is not None else "")
        head = f"trial {self.trial_id}: {self.action} at {where}"
        detail = {
            "not_at_rung": "not at a new rung",
            "first_at_rung": f"value {self.value} is the first at this rung",
            "at_or_above_cutoff": f"value {self.value} is at least as good as the cutoff {self.cutoff}",
            "below_cutoff": f"value {self.value} is worse than the cutoff {self.cutoff}",
            "diverged": f"value {self.value} is not finite (diverged)",
            "reached_max_t": "reached max_t",
            "cannot_finish_before_deadline": "cannot reach the top rung before the deadline",
        }[self.reason]
        return f"{head}: {detail}"


def rung_action(reason: Reason, budget: int, max_t: int) -> tuple[Action, Reason]:
    """The action for a trial judged at a rung (``reason`` from the cutoff): diverged stops, ``max_t`` completes.

    Example::

        >>> rung_action("below_cutoff", 3, 9), rung_action("below_cutoff", 9, 9), rung_action("diverged", 9, 9)
        (('stop', 'below_cutoff'), ('complete', 'reached_max_t'), ('stop', 'diverged'))
    """
    if reason == "diverged":
        return "stop", reason
    if budget >= max_t:  # finished: the cutoff no longer matters
        return "complete", "reached_max_t"
    return ("stop" if reason == "below_cutoff" else "continue"), reason


def off_rung_decision(trial_id: TrialId, budget: int, value: float, max_t: int) -> Decision:
    """The decision for a trial whose budget is not at a new rung: stop if diverged, complete at ``max_t``."""
    if is_diverged(value):
        return Decision(trial_id, "stop", "diverged", budget=budget, value=value)
    if budget >= max_t:
        return Decision(trial_id, "complete", "reached_max_t", budget=budget, value=value)
    return Decision(trial_id, "continue", "not_at_rung", budget=budget, value=value)
