"""Hyperband (Li et al., JMLR 2018): successive-halving brackets, from many short trials to few long."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from lightning_hydro._deprecation import RenamedAttribute
from lightning_hydro.stopping.async_successive_halving import AsyncSuccessiveHalving, TrialReport
from lightning_hydro.stopping.budget_accounting import HalvingBudget, successive_halving_budget
from lightning_hydro.stopping.decision import Decision
from lightning_hydro.stopping.halving_config import (
    HalvingConfig,
    Rounding,
    TrialId,
    check_trial_id,
    keep_count,
)
from lightning_hydro.stopping.open_store import StoreSpec, open_store

BracketOrder = Literal["sequential", "interleaved"]
"""How a stream of trials is dealt to brackets (see :func:`bracket_for_position`)."""


@dataclass(frozen=True)
class HyperbandRung:
    """``trials`` (``n_i``) train to ``budget`` (``r_i``) in a bracket."""

    budget: int
    trials: int


@dataclass(frozen=True)
class HyperbandBracket:
    """One bracket ``s``: ``trials`` (``n``) start, judged by successive halving from ``grace_period`` (``r``).

    Attributes:
        s: The bracket's index, as in the paper: ``s_max`` is the most exploratory (starts at the grace
            period), ``0`` trains every trial to the top milestone without cuts before it.
        trials: ``n = ceil((s_max + 1) * eta**s / (s + 1))``.
        rungs: ``(r_i, n_i)`` for each rung.
        config: The rule of this bracket: the sweep's, with this bracket's ``grace_period``.
        budget: What the bracket spends if every trial reports at every rung.
    """

    s: int
    trials: int
    rungs: tuple[HyperbandRung, ...]
    config: HalvingConfig
    budget: HalvingBudget

    @property
    def grace_period(self) -> int:
        """``r``: the first rung's budget, what each trial of the bracket trains before it is first judged."""
        return self.rungs[0].budget

    min_budget = RenamedAttribute("grace_period", "is renamed grace_period (the callbacks' name); use .grace_period")


def hyperband_brackets(config: HalvingConfig, *, rounding: Rounding = "ceil") -> tuple[HyperbandBracket, ...]:
    """The brackets of one Hyperband iteration, most exploratory first (``s = s_max, ..., 0``).

    With ``R = max_t / grace_period`` and ``eta = reduction_factor``: ``s_max = floor(log_eta(R))`` (the
    number of milestones minus one), bracket ``s`` starts ``n = ceil((s_max + 1) / (s + 1) * eta**s)``
    trials at ``r = grace_period * eta**(s_max - s)`` and runs successive halving over the milestones from
    ``r`` up. Budgets are anchored on the milestones ``grace_period * eta**k``: when ``max_t`` is not one
    of them, the top rung is the last milestone below it and the survivors then train on to ``max_t``.
    ``n_i`` follows ``rounding``: ``"floor"`` gives the paper's ``floor(n / eta**i)``; the default
    ``"ceil"`` is what :class:`HyperbandRule`'s ASHA brackets keep when a bracket's trials report together.

    Example::

        >>> config = HalvingConfig("min", grace_period=1, reduction_factor=3, max_t=81)
        >>> for bracket in hyperband_brackets(config, rounding="floor"):   # Li et al. (2018), Table 1
        ...     print(bracket.s, [(rung.trials, rung.budget) for rung in bracket.rungs])
        4 [(81, 1), (27, 3), (9, 9), (3, 27), (1, 81)]
        3 [(34, 3), (11, 9), (3, 27), (1, 81)]
        2 [(15, 9), (5, 27), (1, 81)]
        1 [(8, 27), (2, 81)]
        0 [(5, 81)]
    """
    keep_count(1, config.reduction_factor, rounding)  # validates rounding
    s_max = len(config.milestones) - 1
    eta = config.reduction_factor
    brackets = []
    for s in range(s_max, -1, -1):
        n_trials = -(-(s_max + 1) * eta**s // (s + 1))
        bracket_config = config.with_grace_period(config.milestones[s_max - s])
        rungs, alive = [], n_trials
        for index, milestone in enumerate(bracket_config.milestones):
            # The paper's n_i = floor(n * eta**-i) equals repeated floor(n_i / eta) for integer eta.
            alive = alive if index == 0 else keep_count(alive, eta, rounding)
            rungs.append(HyperbandRung(budget=milestone, trials=alive))
        budget = successive_halving_budget(n_trials, bracket_config, rounding=rounding)
        brackets.append(HyperbandBracket(s, n_trials, tuple(rungs), bracket_config, budget))
    return tuple(brackets)


def bracket_for_position(position: int, brackets: Sequence[HyperbandBracket], order: BracketOrder) -> int:
    """The ``s`` of the bracket that the ``position``-th trial of a stream (0-based) joins.

    One Hyperband iteration holds ``sum(n_s)`` trials; the stream cycles through iterations.
    ``"sequential"`` fills brackets in the paper's order: the first ``n_{s_max}`` trials go to ``s_max``,
    the next ``n_{s_max - 1}`` to ``s_max - 1``, and so on. ``"interleaved"`` deals them by smooth
    weighted round-robin with weights ``n_s``, so every prefix of the stream (e.g. the first fused group)
    mixes brackets in proportion to their sizes.

    Example::

        >>> brackets = hyperband_brackets(HalvingConfig("min", 1, 3, 9))   # n = 9, 5, 3
        >>> [bracket_for_position(i, brackets, "sequential") for i in (0, 8, 9, 13, 14, 17)]
        [2, 2, 1, 1, 0, 2]
        >>> [bracket_for_position(i, brackets, "interleaved") for i in range(6)]
        [2, 1, 2, 0, 2, 1]
    """
    if order not in ("sequential", "interleaved"):
        raise ValueError(
            f"bracket_for_position: order must be 'sequential' or 'interleaved', got {order!r}. "
            "'sequential' follows the paper; 'interleaved' mixes brackets within each fused group."
        )
    sizes = [bracket.trials for bracket in brackets]
    offset = position % sum(sizes)
    if order == "sequential":
        for bracket, size in zip(brackets, sizes):
            if offset < size:
                return bracket.s
            offset -= size
    credit = [0] * len(sizes)
    chosen = 0
    for _ in range(offset + 1):
        credit = [c + size for c, size in zip(credit, sizes)]
        chosen = max(range(len(sizes)), key=lambda index: (credit[index], -index))
        credit[chosen] -= sum(sizes)
    return brackets[chosen].s


def assign_to_brackets(
    trial_ids: Iterable[TrialId], brackets: Sequence[HyperbandBracket], *, order: BracketOrder = "sequential"
) -> dict[int, list[TrialId]]:
    """Deal ``trial_ids`` to brackets (see :func:`bracket_for_position`): ``{s: [trial ids]}``.

    Example::

        >>> brackets = hyperband_brackets(HalvingConfig("min", 1, 3, 9))
        >>> {s: len(ids) for s, ids in assign_to_brackets(range(17), brackets).items()}
        {2: 9, 1: 5, 0: 3}
    """
    assigned: dict[int, list[TrialId]] = {bracket.s: [] for bracket in brackets}
    for position, trial_id in enumerate(trial_ids):
        assigned[bracket_for_position(position, brackets, order)].append(trial_id)
    return assigned


class HyperbandRule:
    """Hyperband with asynchronous brackets: each trial joins a bracket, where ASHA judges it.

    Each bracket is an :class:`AsyncSuccessiveHalving` over its own rungs (``bracket=s`` in the shared
    store). In a fused group, reporting each bracket's trials together (:meth:`report_batch`) makes a
    bracket whose trials start together run the paper's synchronous successive halving.

    Args:
        config: The sweep's mode, grace period (the smallest budget), reduction factor and max_t.
        store: Where records live (see :func:`~lightning_hydro.stopping.open_store.open_store`).
        order: How new trials are dealt to brackets (see :func:`bracket_for_position`).

    Example::

        >>> hyperband = HyperbandRule(HalvingConfig("max", 1, 3, 9), order="interleaved")
        >>> [hyperband.add_trial(trial).s for trial in ("a", "b", "c", "d")]
        [2, 1, 2, 0]
        >>> hyperband.report("b", budget=3, value=0.7).reason       # bracket 1 starts at budget 3
        'first_at_rung'
        >>> hyperband.report("d", budget=3, value=0.7).reason       # bracket 0 starts at budget 9
        'not_at_rung'
    """

    def __init__(self, config: HalvingConfig, store: StoreSpec = None, *, order: BracketOrder = "sequential") -> None:
        self.config = config
        self.order = order
        self.brackets = hyperband_brackets(config)
        bracket_for_position(0, self.brackets, order)  # validates order
        self.store = open_store(store)
        self._rules = {
            bracket.s: AsyncSuccessiveHalving(bracket.config, self.store, bracket=bracket.s)
            for bracket in self.brackets
        }
        self._assignments: dict[TrialId, int] = {}
        self._next_position = 0

    @property
    def assignments(self) -> dict[TrialId, int]:
        """``{trial_id: s}`` for every trial added."""
        return dict(self._assignments)

    def bracket(self, s: int) -> HyperbandBracket:
        """The bracket with index ``s``."""
        return next(bracket for bracket in self.brackets if bracket.s == s)

    def add_trial(self, trial_id: TrialId, *, position: int | None = None) -> HyperbandBracket:
        """Put a new trial in a bracket and return the bracket.

        Args:
            trial_id: The new trial.
            position: Its place in the sweep's stream of trials. Default: how many trials this object
                added before. Processes that each run one trial pass their job number so that together
                they deal trials as one stream would.

        Raises:
            ValueError: If the trial was already added.
        """
        trial_id = check_trial_id(trial_id, where="HyperbandRule.add_trial")
        if trial_id in self._assignments:
            raise ValueError(
                f"HyperbandRule.add_trial: trial {trial_id!r} is already in bracket "
                f"{self._assignments[trial_id]}. "
                "Add each trial once; give a refilled slot's new trial a new id."
            )
        s = bracket_for_position(self._next_position if position is None else position, self.brackets, self.order)
        self._assignments[trial_id] = s
        self._next_position += 1
        return self.bracket(s)

    def report(self, trial_id: TrialId, budget: int, value: float) -> Decision:
        """Judge one trial in its bracket (see :meth:`AsyncSuccessiveHalving.report`)."""
        return self._rule_of(trial_id, where="report").report(trial_id, budget, value)

    def report_batch(self, reports: Iterable[tuple[TrialId, int, float]]) -> list[Decision]:
        """Judge simultaneous reports, each batch of one bracket together; decisions in input order."""
        batch = [TrialReport(*report) for report in reports]
        by_bracket: dict[int, list[int]] = {}
        for position, report in enumerate(batch):
            s = self._assignment(report.trial_id, where="report_batch")
            by_bracket.setdefault(s, []).append(position)
        decisions: list[Decision | None] = [None] * len(batch)
        for s, positions in by_bracket.items():
            for position, decision in zip(positions, self._rules[s].report_batch([batch[p] for p in positions])):
                decisions[position] = decision
        return [decision for decision in decisions if decision is not None]

    def state_dict(self) -> dict[str, Any]:
        """Settings, bracket assignments and the store's state."""
        return {
            "config": self.config.to_dict(),
            "order": self.order,
            "assignments": [[trial_id, s] for trial_id, s in self._assignments.items()],
            "next_position": self._next_position,
            "store": self.store.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output.

        Raises:
            ValueError: If the state was saved with other settings.
        """
        if dict(state["config"]) != self.config.to_dict() or state["order"] != self.order:
            raise ValueError(
                f"HyperbandRule.load_state_dict: the checkpoint was made with {dict(state['config'])} and "
                f"order={state['order']!r}, but this rule has {self.config.to_dict()} and "
                f"order={self.order!r}. Resume with the settings the run started with."
            )
        for rule in self._rules.values():
            rule.load_state_dict(rule.state_dict() | {"store": state["store"]})
        self._assignments = {trial_id: int(s) for trial_id, s in state["assignments"]}
        self._next_position = int(state["next_position"])

    def _assignment(self, trial_id: TrialId, *, where: str) -> int:
        if trial_id not in self._assignments:
            raise ValueError(
                f"HyperbandRule.{where}: trial {trial_id!r} has no bracket. Call add_trial({trial_id!r}) "
                "when the trial starts."
            )
        return self._assignments[trial_id]

    def _rule_of(self, trial_id: TrialId, *, where: str) -> AsyncSuccessiveHalving:
        return self._rules[self._assignment(trial_id, where=where)]
