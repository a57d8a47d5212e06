"""Fluid-style group sizing: extrapolate costs measured at B=1 and B=2 to the largest group that fits.

Pure maths. The caller measures (e.g. peak GPU memory and step time of a fused group of 1, then of 2
trials), plans the size, then checks the prediction against a measurement of the real group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class LinearCost:
    """A cost that grows linearly with the group size ``B``: ``fixed + per_trial * B``.

    Example::

        >>> memory = LinearCost.from_measurements(at_one=1.5, at_two=2.0)   # e.g. GiB
        >>> memory.fixed, memory.per_trial, memory.predict(8)
        (1.0, 0.5, 5.0)
        >>> memory.largest_group_size(6.2)
        10
    """

    fixed: float
    per_trial: float

    @classmethod
    def from_measurements(cls, at_one: float, at_two: float) -> LinearCost:
        """The line through the costs measured with one and with two trials.

        Raises:
            ValueError: If a measurement is negative or not finite.
        """
        for name, measured in (("at_one", at_one), ("at_two", at_two)):
            if not math.isfinite(measured) or measured < 0:
                raise ValueError(
                    f"LinearCost.from_measurements: {name} must be a finite cost >= 0, got {measured!r}. "
                    "Pass the measured peak memory (or step time) of a group of that many trials."
                )
        per_trial = at_two - at_one
        return cls(fixed=at_one - per_trial, per_trial=per_trial)

    @classmethod
    def fit(cls, measurements: Sequence[tuple[int, float]]) -> LinearCost:
        """The least-squares line through ``(group_size, cost)`` measurements, never decreasing with ``B``.

        One distinct group size gives a constant (``per_trial = 0``): without a second size nothing says how
        the cost scales, and a constant never predicts a smaller group to be cheaper than measured. A fitted
        slope below zero (noise) is likewise replaced by the constant mean cost.

        Raises:
            ValueError: If there are no measurements, or one has a group size < 1 or a cost that is negative
                or not finite.

        Example::

            >>> line = LinearCost.fit([(1, 3.0), (2, 4.0), (4, 6.1), (4, 5.9)])   # seconds per epoch at B
            >>> round(line.fixed, 6), round(line.per_trial, 6)
            (2.0, 1.0)
            >>> LinearCost.fit([(3, 5.0), (3, 7.0)])
            LinearCost(fixed=6.0, per_trial=0.0)
        """
        if not measurements:
            raise ValueError("LinearCost.fit: no measurements; pass (group_size, cost) pairs.")
        for size, measured in measurements:
            if size < 1 or not math.isfinite(measured) or measured < 0:
                raise ValueError(
                    f"LinearCost.fit: each measurement must be (group_size >= 1, finite cost >= 0), got "
                    f"({size!r}, {measured!r})."
                )
        n = len(measurements)
        mean_size = sum(size for size, _ in measurements) / n
        mean_cost = sum(measured for _, measured in measurements) / n
        spread = sum((size - mean_size) ** 2 for size, _ in measurements)
        if spread == 0:
            return cls(fixed=mean_cost, per_trial=0.0)
        slope = sum((size - mean_size) * (measured - mean_cost) for size, measured in measurements) / spread
        if slope <= 0:
            return cls(fixed=mean_cost, per_trial=0.0)
        return cls(fixed=mean_cost - slope * mean_size, per_trial=slope)

    def predict(self, group_size: int) -> float:
        """The cost of a group of ``group_size`` trials."""
        return self.fixed + self.per_trial * group_size

    def largest_group_size(self, limit: float, *, max_group_size: int | None = None) -> int:
        """The largest ``B >= 0`` whose predicted cost is at most ``limit`` (capped by ``max_group_size``).

        Raises:
            ValueError: If the cost does not grow with ``B`` and no ``max_group_size`` bounds it.
        """
        if self.per_trial <= 0:
            if max_group_size is None:
                raise ValueError(
                    f"LinearCost.largest_group_size: the cost does not grow with the group size (per trial "
                    f"{self.per_trial}), so the measurements cannot bound it. Measure again with a realistic "
                    "batch, or pass max_group_size."
                )
            return max_group_size if self.predict(max_group_size) <= limit else 0
        if max_group_size is not None and self.predict(max_group_size) <= limit:
            return max_group_size
        quotient = (limit - self.fixed) / self.per_trial
        if not math.isfinite(quotient):
            raise ValueError(
                "LinearCost.largest_group_size: the cost grows too little per trial "
                f"({self.per_trial}) to bound the group size. Measure again with a realistic batch, or pass "
                "max_group_size."
            )
        largest = max(0, math.floor(quotient))
        # The quotient is rounded: step to the exact answer of the prediction itself, both ways.
        while largest > 0 and self.predict(largest) > limit:
            largest -= 1
        while self.predict(largest + 1) <= limit:
            largest += 1
        return largest if max_group_size is None else min(largest, max_group_size)


@dataclass(frozen=True)
class GroupSizePlan:
    """The group size chosen by :func:`plan_group_size`, and what it is predicted to cost.

    Attributes:
        group_size: How many trials to fuse.
        predicted_memory: The memory the group is predicted to need.
        usable_memory: The budget less the safety margin.
        memory: The fitted memory model.
        step_time: The fitted step-time model, if step times were given.
    """

    group_size: int
    predicted_memory: float
    usable_memory: float
    memory: LinearCost
    step_time: LinearCost | None = None

    @property
    def predicted_step_time(self) -> float | None:
        """Seconds per step of the whole group, if step times were measured."""
        return None if self.step_time is None else self.step_time.predict(self.group_size)

    @property
    def predicted_trial_steps_per_second(self) -> float | None:
        """Trial-steps per second (``group_size / step time``): the throughput fusion buys."""
        seconds = self.predicted_step_time
        return None if seconds is None or seconds <= 0 else self.group_size / seconds


def plan_group_size(
    memory_at_one: float,
    memory_at_two: float,
    memory_budget: float,
    *,
    safety_margin: float = 0.1,
    max_group_size: int | None = None,
    step_time_at_one: float | None = None,
    step_time_at_two: float | None = None,
) -> GroupSizePlan:
    """The largest group whose linearly extrapolated memory fits ``memory_budget * (1 - safety_margin)``.

    Args:
        memory_at_one: Peak memory measured with one trial.
        memory_at_two: Peak memory measured with two trials (same units).
        memory_budget: Memory available (e.g. the GPU's total).
        safety_margin: Fraction of the budget kept free for what the line does not model
            (fragmentation, spikes), in ``[0, 1)``.
        max_group_size: An upper bound (e.g. the number of trials left to run).
        step_time_at_one: Seconds per step with one trial, to predict the group's speed (optional).
        step_time_at_two: Seconds per step with two trials.

    Raises:
        ValueError: For a budget <= 0, a margin outside ``[0, 1)``, ``max_group_size < 1``, only one
            step time, a memory that does not grow with B (without ``max_group_size``), or when not
            even one trial fits.

    Example::

        >>> plan = plan_group_size(1.5, 2.0, 10.0, step_time_at_one=0.02, step_time_at_two=0.025)
        >>> plan.group_size, plan.predicted_memory, round(plan.predicted_step_time, 3)
        (16, 9.0, 0.095)
    """
    if not math.isfinite(memory_budget) or memory_budget <= 0:
        raise ValueError(f"plan_group_size: memory_budget must be a finite amount > 0, got {memory_budget!r}.")
    if not 0 <= safety_margin < 1:
        raise ValueError(
            f"plan_group_size: safety_margin must be in [0, 1), got {safety_margin!r}. It is the fraction of "
            "memory_budget kept free; 0.1 keeps 10%."
        )
    if max_group_size is not None and max_group_size < 1:
        raise ValueError(f"plan_group_size: max_group_size must be >= 1 or None, got {max_group_size!r}.")
    if (step_time_at_one is None) != (step_time_at_two is None):
        raise ValueError(
            "plan_group_size: pass both step_time_at_one and step_time_at_two (to predict the group's step "
            "time), or neither."
        )
    memory = LinearCost.from_measurements(memory_at_one, memory_at_two)
    usable = memory_budget * (1 - safety_margin)
    group_size = memory.largest_group_size(usable, max_group_size=max_group_size)
    if group_size < 1:
        raise ValueError(
            f"plan_group_size: even one trial is predicted to need {memory.predict(1):g}, more than the "
            f"usable {usable:g} ({memory_budget:g} less a {safety_margin:g} safety margin). Shrink the model "
            "or batch, "
            "lower safety_margin, or use a device with more memory."
        )
    step_time = None
    if step_time_at_one is not None and step_time_at_two is not None:
        step_time = LinearCost.from_measurements(step_time_at_one, step_time_at_two)
    return GroupSizePlan(group_size, memory.predict(group_size), usable, memory, step_time)


@dataclass(frozen=True)
class PredictionCheck:
    """A measurement set against its prediction: see :func:`check_prediction`.

    Attributes:
        group_size: The group measured.
        predicted: The model's prediction for it.
        measured: What was measured.
        tolerance: The relative error accepted.
    """

    group_size: int
    predicted: float
    measured: float
    tolerance: float

    @property
    def relative_error(self) -> float:
        """``(measured - predicted) / predicted``: positive when the group costs more than predicted."""
        return (self.measured - self.predicted) / self.predicted if self.predicted else math.inf

    @property
    def ok(self) -> bool:
        """True when ``|relative_error| <= tolerance``."""
        return abs(self.relative_error) <= self.tolerance

    def describe(self) -> str:
        """One line for logs."""
        verdict = "within" if self.ok else "outside"
        return (
            f"B={self.group_size}: measured {self.measured:g} vs predicted {self.predicted:g} "
            f"({self.relative_error:+.1%}, {verdict} the {self.tolerance:.0%} tolerance)"
        )


def check_prediction(model: LinearCost, group_size: int, measured: float, *, tolerance: float = 0.1) -> PredictionCheck:
    """Compare a measured cost of a group with the linear model's prediction.

    Example::

        >>> check = check_prediction(LinearCost(1.0, 0.5), group_size=8, measured=5.6)
        >>> check.ok, check.describe()
        (False, 'B=8: measured 5.6 vs predicted 5 (+12.0%, outside the 10% tolerance)')
    """
    if tolerance < 0:
        raise ValueError(f"check_prediction: tolerance must be >= 0, got {tolerance!r} (0.1 accepts 10%).")
    if not math.isfinite(measured):
        raise ValueError(f"check_prediction: measured must be finite, got {measured!r}.")
    return PredictionCheck(group_size, model.predict(group_size), measured, tolerance)
