"""The maths of rung cutoffs: pure functions over plain values, shared by every rule.

Values are first turned into *scores* where higher is better (``value`` in ``"max"`` mode, ``-value`` in
``"min"`` mode); a NaN or infinite value is a diverged trial and scores ``-inf``, below every finite value,
whatever the mode.

ASHA's cutoff at a rung is the ``q = 1 - 1/eta`` quantile of the scores recorded there, linearly
interpolated between order statistics: with the ``n`` scores sorted ascending as ``s[0..n-1]`` and
``p = q * (n - 1)``, the cutoff is ``s[floor(p)] + (p - floor(p)) * (s[ceil(p)] - s[floor(p)])``. This is
numpy's default ``"linear"`` method (Hyndman and Fan's type 7), which Ray Tune's AsyncHyperBandScheduler
uses. It is computed exactly in rational arithmetic (floats are exact rationals), so a decision never
depends on rounding. A trial continues when its score is at least the cutoff (ties continue); a diverged
trial always stops. If the lower order statistic is a diverged score the cutoff is ``-inf``: every finite
value passes.

Over a batch of ``n`` distinct finite values, this rule keeps exactly ``ceil(n / eta)`` of them: the
``"ceil"`` rounding of :func:`~lightning_hydro.stopping.halving_config.keep_count`. That is why ASHA
deciding a whole fused group at once equals synchronous successive halving.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

from lightning_hydro.stopping.decision import Reason
from lightning_hydro.stopping.halving_config import Mode

Score = Fraction | None
"""An exact score (higher is better), or None for a diverged value (``-inf``)."""


def to_score(value: float, mode: Mode) -> Score:
    """The exact score of ``value``: higher is better; None (``-inf``) if NaN or infinite.

    Example::

        >>> to_score(0.5, "min"), to_score(0.5, "max"), to_score(float("nan"), "max")
        (Fraction(-1, 2), Fraction(1, 2), None)
    """
    if not math.isfinite(value):
        return None
    exact = Fraction(value)
    return -exact if mode == "min" else exact


def to_value(score: Score, mode: Mode) -> float:
    """The metric value of ``score`` (``-inf`` maps to the worst value of the mode)."""
    if score is None:
        return math.inf if mode == "min" else -math.inf
    return float(-score if mode == "min" else score)


def sort_scores(scores: Sequence[Score]) -> list[Score]:
    """``scores`` in ascending order, diverged (None) first."""
    diverged: list[Score] = [score for score in scores if score is None]
    finite = sorted(score for score in scores if score is not None)
    return diverged + list(finite)


def quantile_score(scores: Sequence[Score], reduction_factor: int) -> Score:
    """The exact ``1 - 1/reduction_factor`` quantile of ``scores`` (linear interpolation, see module doc).

    Example::

        >>> from fractions import Fraction as F
        >>> quantile_score([F(1), F(2), F(3), F(4)], 3)   # p = 2/3 * 3 = 2: exactly the third value
        Fraction(3, 1)
        >>> quantile_score([F(1), F(2)], 3)               # p = 2/3: 1 + 2/3 * (2 - 1)
        Fraction(5, 3)
    """
    if not scores:
        raise ValueError("quantile_score: needs at least one score, got none.")
    ordered = sort_scores(scores)
    numerator = (len(ordered) - 1) * (reduction_factor - 1)
    lower_index, remainder = divmod(numerator, reduction_factor)
    lower = ordered[lower_index]
    if remainder == 0 or lower is None:
        return lower
    upper = ordered[lower_index + 1]
    if upper is None:  # cannot happen (None sorts first) but keeps the types honest
        return None
    return lower + Fraction(remainder, reduction_factor) * (upper - lower)


def judge_against_quantile(
    value: float, recorded: Sequence[float], mode: Mode, reduction_factor: int
) -> tuple[Reason, float | None]:
    """ASHA's verdict on ``value`` given the values ``recorded`` at the rung (the cutoff's population).

    Returns the reason (``"diverged"``, ``"first_at_rung"``, ``"at_or_above_cutoff"`` or
    ``"below_cutoff"``) and the cutoff in metric units (None when there is none).

    Example::

        >>> judge_against_quantile(3.0, [1.0, 2.0, 4.0, 8.0], "min", 3)
        ('below_cutoff', 2.0)
        >>> judge_against_quantile(0.3, [], "min", 3)
        ('first_at_rung', None)
    """
    if not recorded:
        return ("diverged" if to_score(value, mode) is None else "first_at_rung"), None
    cutoff_score = quantile_score([to_score(v, mode) for v in recorded], reduction_factor)
    return _verdict(to_score(value, mode), cutoff_score), to_value(cutoff_score, mode)


def judge_against_top_k(value: float, cohort: Sequence[float], mode: Mode, keep: int) -> tuple[Reason, float | None]:
    """Synchronous halving's verdict on ``value``: is it among the ``keep`` best of ``cohort``?

    Ties with the ``keep``-th best value are all kept; a diverged value is never kept. Returns the reason
    and the ``keep``-th best value as the cutoff, in metric units.

    Example::

        >>> judge_against_top_k(0.3, [0.1, 0.2, 0.3], "min", 1)
        ('below_cutoff', 0.1)
    """
    cutoff_score = top_k_score([to_score(v, mode) for v in cohort], keep)
    return _verdict(to_score(value, mode), cutoff_score), to_value(cutoff_score, mode)


def _verdict(score: Score, cutoff_score: Score) -> Reason:
    if score is None:
        return "diverged"
    return "at_or_above_cutoff" if cutoff_score is None or score >= cutoff_score else "below_cutoff"


def top_k_score(scores: Sequence[Score], keep: int) -> Score:
    """The ``keep``-th best score: synchronous halving keeps every score at least this good.

    Example::

        >>> from fractions import Fraction as F
        >>> top_k_score([F(1), F(5), F(3), None], 2)
        Fraction(3, 1)
    """
    if not 1 <= keep <= len(scores):
        raise ValueError(f"top_k_score: keep must be between 1 and {len(scores)}, got {keep}.")
    return sort_scores(scores)[len(scores) - keep]
