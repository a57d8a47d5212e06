import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_hydro.stopping import LinearCost
from lightning_hydro.stopping.group_sizing import check_prediction, plan_group_size


def test_linear_extrapolation_from_one_and_two_trials() -> None:
    memory = LinearCost.from_measurements(at_one=3.0, at_two=4.0)
    assert (memory.fixed, memory.per_trial) == (2.0, 1.0)
    assert memory.predict(10) == 12.0
    assert memory.largest_group_size(12.0) == 10
    assert memory.largest_group_size(11.99) == 9
    assert memory.largest_group_size(1.0) == 0
    assert memory.largest_group_size(100.0, max_group_size=16) == 16


def test_plan_keeps_a_safety_margin_and_predicts_speed() -> None:
    plan = plan_group_size(3.0, 4.0, memory_budget=20.0, safety_margin=0.1, step_time_at_one=0.1, step_time_at_two=0.12)
    assert (plan.group_size, plan.usable_memory, plan.predicted_memory) == (16, 18.0, 18.0)
    assert plan.predicted_step_time == pytest.approx(0.08 + 0.02 * 16)
    assert plan.predicted_trial_steps_per_second == pytest.approx(16 / 0.4)
    assert plan_group_size(3.0, 4.0, 20.0, safety_margin=0.0).group_size == 18
    assert plan_group_size(3.0, 4.0, 20.0, max_group_size=5).group_size == 5
    assert plan_group_size(3.0, 4.0, 20.0).predicted_step_time is None


def test_memory_that_does_not_grow_needs_an_explicit_bound() -> None:
    with pytest.raises(ValueError, match=r"the cost does not grow with the group size .*pass max_group_size"):
        plan_group_size(3.0, 3.0, 20.0)
    assert plan_group_size(3.0, 2.9, 20.0, max_group_size=12).group_size == 12


def test_not_even_one_trial_fits() -> None:
    with pytest.raises(ValueError, match=r"even one trial is predicted to need 30, more than the usable 18 \(20 less"):
        plan_group_size(30.0, 40.0, 20.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"memory_budget": 0.0}, r"memory_budget must be a finite amount > 0, got 0\.0"),
        ({"safety_margin": 1.0}, r"safety_margin must be in \[0, 1\), got 1\.0\. It is the fraction"),
        ({"max_group_size": 0}, r"max_group_size must be >= 1 or None, got 0"),
        ({"step_time_at_one": 0.1}, r"pass both step_time_at_one and step_time_at_two"),
        (
            {"memory_at_one": -1.0},
            r"at_one must be a finite cost >= 0, got -1\.0\. Pass the measured peak memory",
        ),
        ({"memory_at_two": math.nan}, r"at_two must be a finite cost >= 0, got nan"),
    ],
)
def test_plan_checks_its_arguments(kwargs: dict[str, float], message: str) -> None:
    arguments = {"memory_at_one": 3.0, "memory_at_two": 4.0, "memory_budget": 20.0} | kwargs
    with pytest.raises(ValueError, match=message):
        plan_group_size(**arguments)  # type: ignore[arg-type]


def test_check_prediction() -> None:
    model = LinearCost(2.0, 1.0)
    assert check_prediction(model, 10, 12.5).ok
    check = check_prediction(model, 10, 14.0, tolerance=0.1)
    assert not check.ok
    assert check.relative_error == pytest.approx(2 / 12)
    assert check.describe() == "B=10: measured 14 vs predicted 12 (+16.7%, outside the 10% tolerance)"
    assert check_prediction(LinearCost(0.0, 0.0), 3, 1.0).relative_error == math.inf
    with pytest.raises(ValueError, match=r"tolerance must be >= 0, got -0\.1"):
        check_prediction(model, 10, 12.0, tolerance=-0.1)
    with pytest.raises(ValueError, match=r"measured must be finite, got inf"):
        check_prediction(model, 10, math.inf)


@settings(max_examples=200, deadline=None)
@given(
    at_one=st.floats(0.0, 1e3),
    growth=st.floats(1e-3, 1e3),
    budget=st.floats(1e-3, 1e5),
    margin=st.floats(0.0, 0.9),
)
def test_the_chosen_size_fits_and_one_more_would_not(
    at_one: float, growth: float, budget: float, margin: float
) -> None:
    memory = LinearCost.from_measurements(at_one, at_one + growth)
    usable = budget * (1 - margin)
    size = memory.largest_group_size(usable)
    assert size == 0 or memory.predict(size) <= usable
    assert memory.predict(size + 1) > usable


def test_a_cost_growing_too_little_to_bound_needs_max_group_size() -> None:
    with pytest.raises(ValueError, match=r"grows too little per trial \(1e-320\) to bound the group size"):
        LinearCost(1.0, 1e-320).largest_group_size(1e10)
    assert LinearCost(1.0, 1e-320).largest_group_size(1e10, max_group_size=64) == 64


def test_least_squares_fit_through_many_group_sizes() -> None:
    line = LinearCost.fit([(1, 3.0), (2, 4.0), (4, 6.1), (4, 5.9), (8, 10.0)])
    assert line.fixed == pytest.approx(2.0)
    assert line.per_trial == pytest.approx(1.0)


def test_fit_with_one_size_or_a_falling_line_is_a_constant() -> None:
    assert LinearCost.fit([(3, 5.0), (3, 7.0)]) == LinearCost(fixed=6.0, per_trial=0.0)
    assert LinearCost.fit([(1, 5.0), (2, 4.0)]) == LinearCost(fixed=4.5, per_trial=0.0)


@pytest.mark.parametrize("measurements", [[], [(0, 1.0)], [(1, -1.0)], [(2, math.nan)]])
def test_fit_rejects_bad_measurements(measurements) -> None:
    with pytest.raises(ValueError, match=r"LinearCost.fit: (no measurements|each measurement must be)"):
        LinearCost.fit(measurements)
