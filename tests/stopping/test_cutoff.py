import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_hydro.stopping.cutoff import (
    judge_against_quantile,
    judge_against_top_k,
    quantile_score,
    to_score,
    to_value,
    top_k_score,
)

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(finite, min_size=1, max_size=40), eta=st.integers(2, 6))
def test_quantile_is_numpys_linear_quantile(values: list[float], eta: int) -> None:
    exact = quantile_score([Fraction(v) for v in values], eta)
    assert exact is not None
    assert float(exact) == pytest.approx(np.quantile(values, 1 - 1 / eta, method="linear"), rel=1e-9, abs=1e-6)


def test_scores_make_higher_better_and_divergence_worst() -> None:
    assert to_score(2.0, "max") == 2
    assert to_score(2.0, "min") == -2
    for diverged in (math.nan, math.inf, -math.inf):
        assert to_score(diverged, "min") is None
        assert to_score(diverged, "max") is None
    assert to_value(None, "min") == math.inf
    assert to_value(None, "max") == -math.inf
    assert to_value(Fraction(-3, 2), "min") == 1.5


def test_minus_infinity_loss_counts_as_diverged_not_as_best() -> None:
    reason, _ = judge_against_quantile(-math.inf, [1.0, 2.0], "min", 3)
    assert reason == "diverged"


def test_cutoff_is_exact_so_interpolated_boundaries_do_not_depend_on_rounding() -> None:
    # 1 + 2/3 * (2 - 1) = 5/3: a float cutoff would round; the rule compares exactly.
    assert quantile_score([Fraction(1), Fraction(2)], 3) == Fraction(5, 3)
    just_below = math.nextafter(5 / 3, 0)  # the float 5/3 rounds up; the float before it is below 5/3
    assert Fraction(just_below) < Fraction(5, 3) < Fraction(5 / 3)
    assert judge_against_quantile(just_below, [1.0, 2.0], "max", 3)[0] == "below_cutoff"
    assert judge_against_quantile(5 / 3, [1.0, 2.0], "max", 3)[0] == "at_or_above_cutoff"


def test_a_diverged_lower_order_statistic_lets_every_finite_value_through() -> None:
    # Sorted ascending: [-inf, -inf, 5]; p = 2/3 * 2 = 4/3 lies between -inf and 5.
    reason, cutoff = judge_against_quantile(0.0, [math.nan, math.nan, 5.0], "max", 3)
    assert reason == "at_or_above_cutoff"
    assert cutoff == -math.inf


def test_first_value_at_a_rung_passes_unless_diverged() -> None:
    assert judge_against_quantile(123.0, [], "min", 3) == ("first_at_rung", None)
    assert judge_against_quantile(math.nan, [], "min", 3) == ("diverged", None)


def test_ties_with_the_cutoff_continue() -> None:
    assert judge_against_quantile(1.0, [1.0, 1.0, 1.0], "min", 3) == ("at_or_above_cutoff", 1.0)


def test_top_k() -> None:
    assert judge_against_top_k(0.2, [0.1, 0.2, 0.3, 0.4], "min", 2) == ("at_or_above_cutoff", 0.2)
    assert judge_against_top_k(0.3, [0.1, 0.2, 0.3, 0.4], "min", 2) == ("below_cutoff", 0.2)
    assert judge_against_top_k(math.nan, [math.nan], "min", 1)[0] == "diverged"
    with pytest.raises(ValueError, match=r"top_k_score: keep must be between 1 and 2, got 3"):
        top_k_score([Fraction(1), Fraction(2)], 3)


def test_quantile_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"quantile_score: needs at least one score, got none"):
        quantile_score([], 3)
