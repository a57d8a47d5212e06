"""Trial-budget bookkeeping: what a halving schedule spends, against training every trial to max_t."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lightning_hydro.stopping.halving_config import AnyTrialId, HalvingConfig, Rounding, keep_count


@dataclass(frozen=True)
class BudgetSummary:
    """Trial-budget spent against the exhaustive cost of running every trial to ``max_t``.

    Attributes:
        trials: How many trials.
        spent: Sum over trials of the budget (epochs or steps) each trained.
        exhaustive: ``trials * max_t``.

    Example::

        >>> summary = summarize_budget({"a": 9, "b": 1, "c": 3}, max_t=9)
        >>> summary.spent, summary.exhaustive, round(summary.fraction, 3)
        (13, 27, 0.481)
    """

    trials: int
    spent: int
    exhaustive: int

    @property
    def fraction(self) -> float:
        """``spent / exhaustive`` (0 when there are no trials)."""
        return self.spent / self.exhaustive if self.exhaustive else 0.0


@dataclass(frozen=True)
class HalvingBudget(BudgetSummary):
    """What synchronous successive halving spends on a cohort: see :func:`successive_halving_budget`.

    Attributes:
        milestones: The rung budgets.
        trials_per_rung: How many trials reach each milestone.
        finishers: How many trials train to ``max_t``.
    """

    milestones: tuple[int, ...]
    trials_per_rung: tuple[int, ...]
    finishers: int


def successive_halving_budget(n_trials: int, config: HalvingConfig, *, rounding: Rounding = "ceil") -> HalvingBudget:
    """The budget synchronous successive halving spends on ``n_trials`` that start together.

    Every trial trains to the first milestone; at each milestone ``keep_count(n, eta, rounding)`` go on to
    the next; the survivors of the last milestone train on to ``max_t``. (A top milestone equal to
    ``max_t`` cuts no one: those trials are complete.) Assumes no trial diverges and no ties.

    Example::

        >>> budget = successive_halving_budget(27, HalvingConfig("min", 1, 3, 9))
        >>> budget.trials_per_rung, budget.spent, budget.exhaustive   # 27*1 + 9*(3-1) + 3*(9-3)
        ((27, 9, 3), 63, 243)
    """
    if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 0:
        raise ValueError(f"successive_halving_budget: n_trials must be an integer >= 0, got {n_trials!r}.")
    trials_per_rung = []
    alive, spent, previous = n_trials, 0, 0
    for milestone in config.milestones:
        trials_per_rung.append(alive)
        spent += alive * (milestone - previous)
        previous = milestone
        if milestone < config.max_t:
            alive = keep_count(alive, config.reduction_factor, rounding)
    spent += alive * (config.max_t - previous)
    return HalvingBudget(
        trials=n_trials,
        spent=spent,
        exhaustive=n_trials * config.max_t,
        milestones=config.milestones,
        trials_per_rung=tuple(trials_per_rung),
        finishers=alive,
    )


def summarize_budget(used: Mapping[AnyTrialId, int], max_t: int) -> BudgetSummary:
    """Sum the budget each trial used (as a callback measured it) against running all to ``max_t``."""
    return BudgetSummary(trials=len(used), spent=sum(used.values()), exhaustive=len(used) * max_t)
