"""The settings every successive-halving rule shares, and the rung milestones they imply."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

Mode = Literal["min", "max"]
"""Whether a lower (``"min"``, e.g. a loss) or a higher (``"max"``, e.g. an accuracy) value is better."""

Rounding = Literal["ceil", "floor"]
"""How many of ``n`` trials a synchronous halving keeps: ``ceil(n / eta)`` or ``max(1, floor(n / eta))``."""

TrialId = int | str
"""A trial's identifier: a slot's trial number in a fused group, or any string (e.g. a Hydra job id)."""

AnyTrialId = TypeVar("AnyTrialId", bound=TrialId)
"""A trial-id type kept through a call, so that e.g. a ``dict[int, float]`` of values type-checks."""


@dataclass(frozen=True)
class HalvingConfig:
    """Mode, grace period, reduction factor and maximum budget of a successive-halving rule.

    Budgets are whole units of training (epochs or steps: the caller decides). A trial is judged at the
    *rung milestones* ``grace_period * reduction_factor**k`` that do not exceed ``max_t``; a trial that
    survives the last milestone trains on to ``max_t`` and is then complete.

    Args:
        mode: ``"min"`` if a lower monitored value is better, ``"max"`` if a higher one is.
        grace_period: Budget at the first rung (>= 1): no trial is judged before it.
        reduction_factor: ``eta``, an integer >= 2: each rung keeps about ``1/eta`` of the trials and
            is ``eta`` times further along than the previous one.
        max_t: Budget at which a trial is complete (>= ``grace_period``).

    Raises:
        ValueError: For a mode other than min/max, ``reduction_factor <= 1``, ``grace_period < 1`` or
            ``grace_period > max_t``.
        TypeError: For a budget or reduction factor that is not an integer.

    Example::

        >>> config = HalvingConfig(mode="min", grace_period=1, reduction_factor=3, max_t=10)
        >>> config.milestones
        (1, 3, 9)
        >>> config.milestone_at_or_below(5), config.milestone_at_or_below(0)
        (3, None)
    """

    mode: Mode
    grace_period: int
    reduction_factor: int
    max_t: int
    milestones: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.mode not in ("min", "max"):
            raise ValueError(
                f"HalvingConfig: mode must be 'min' or 'max', got {self.mode!r}. Use mode='min' when a lower "
                "value is better (a loss) and mode='max' when a higher value is better (an accuracy)."
            )
        _check_integer("reduction_factor", self.reduction_factor)
        if self.reduction_factor <= 1:
            raise ValueError(
                f"HalvingConfig: reduction_factor must be an integer >= 2, got {self.reduction_factor}. "
                "It is the factor eta by which each rung cuts the trials (keeping about 1/eta); "
                "use 2, 3 (the usual choice) or 4."
            )
        _check_integer("grace_period", self.grace_period)
        _check_integer("max_t", self.max_t)
        if self.grace_period < 1:
            raise ValueError(
                f"HalvingConfig: grace_period must be >= 1, got {self.grace_period}. It is the budget "
                "(epochs or steps) every trial gets before it is first judged; use grace_period=1 or more."
            )
        if self.grace_period > self.max_t:
            raise ValueError(
                f"HalvingConfig: grace_period ({self.grace_period}) must not exceed max_t ({self.max_t}), "
                "or no trial would ever be judged. Lower grace_period or raise max_t."
            )
        milestones = []
        budget = self.grace_period
        while budget <= self.max_t:
            milestones.append(budget)
            budget *= self.reduction_factor
        object.__setattr__(self, "milestones", tuple(milestones))

    @property
    def top_milestone(self) -> int:
        """The last rung's budget: the furthest point at which a trial is judged."""
        return self.milestones[-1]

    def milestone_at_or_below(self, budget: int) -> int | None:
        """The highest milestone not above ``budget``, or None before the first rung."""
        reached = [milestone for milestone in self.milestones if milestone <= budget]
        return reached[-1] if reached else None

    def rung_of(self, milestone: int) -> int:
        """The index (0 for the first rung) of ``milestone`` in :attr:`milestones`."""
        return self.milestones.index(milestone)

    def next_milestone(self, budget: int) -> int | None:
        """The first milestone strictly above ``budget``, or None past the last rung."""
        ahead = [milestone for milestone in self.milestones if milestone > budget]
        return ahead[0] if ahead else None

    def with_grace_period(self, grace_period: int) -> HalvingConfig:
        """The same rule starting at another first rung (what a Hyperband bracket uses)."""
        return HalvingConfig(self.mode, grace_period, self.reduction_factor, self.max_t)

    def to_dict(self) -> dict[str, Any]:
        """The settings as a plain dict (what stores compare across processes and checkpoints keep)."""
        return {
            "mode": self.mode,
            "grace_period": self.grace_period,
            "reduction_factor": self.reduction_factor,
            "max_t": self.max_t,
        }


def keep_count(n_trials: int, reduction_factor: int, rounding: Rounding = "ceil") -> int:
    """How many of ``n_trials`` a synchronous halving step keeps.

    ``"ceil"`` keeps ``ceil(n / eta)``: the count that ASHA's quantile cutoff gives a batch (see
    :mod:`~lightning_hydro.stopping.cutoff`), and never zero. ``"floor"`` keeps
    ``max(1, floor(n / eta))``, the rounding of Li et al.'s Hyperband tables.

    Example::

        >>> keep_count(10, 3), keep_count(10, 3, "floor"), keep_count(2, 3, "floor")
        (4, 3, 1)
    """
    if n_trials <= 0:
        return 0
    if rounding == "ceil":
        return -(-n_trials // reduction_factor)
    if rounding == "floor":
        return max(1, n_trials // reduction_factor)
    raise ValueError(
        f"keep_count: rounding must be 'ceil' or 'floor', got {rounding!r}. 'ceil' matches ASHA on a "
        "batch; 'floor' reproduces the Hyperband paper's tables."
    )


def check_value(value: object, *, where: str) -> float:
    """``value`` as a float, or a TypeError naming ``where`` if it is not a real number.

    NaN and infinities pass: they mean a diverged trial, which every rule ranks last. Any real number
    (including numpy scalars) is accepted; a tensor is not.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{where}: the monitored value must be a real number (int or float), got "
            f"{type(value).__name__} {value!r}. Pass a float, e.g. float(tensor.item())."
        )
    return float(value)


def check_budget(budget: object, *, where: str) -> int:
    """``budget`` as an int, or an error naming ``where`` if it is not a non-negative integer."""
    if isinstance(budget, bool) or not isinstance(budget, numbers.Integral):
        raise TypeError(
            f"{where}: budget must be an integer number of epochs or steps, got {type(budget).__name__} "
            f"{budget!r}. Pass e.g. trainer.current_epoch + 1."
        )
    if budget < 0:
        raise ValueError(f"{where}: budget must be >= 0, got {budget}. Pass the epochs or steps trained so far.")
    return int(budget)


def check_trial_id(trial_id: object, *, where: str) -> TrialId:
    """``trial_id`` unchanged, or a TypeError naming ``where`` if it is not an int or a str."""
    if isinstance(trial_id, bool) or not isinstance(trial_id, int | str):
        raise TypeError(
            f"{where}: trial_id must be an int or a str, got {type(trial_id).__name__} {trial_id!r}. "
            "Use the slot's trial number or a string such as the Hydra job id."
        )
    return trial_id


def is_diverged(value: float) -> bool:
    """True for NaN and infinities: values of a diverged trial."""
    return not math.isfinite(value)


def _check_integer(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"HalvingConfig: {name} must be an integer, got {type(value).__name__} {value!r}. "
            "Budgets are whole epochs or steps and rung milestones are grace_period * reduction_factor**k."
        )
