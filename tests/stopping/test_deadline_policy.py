import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_hydro.stopping import DeadlinePolicy, HalvingConfig, LinearCost, TrialProgress

POLICY = DeadlinePolicy(HalvingConfig("max", grace_period=1, reduction_factor=3, max_t=10))  # top rung 9


def test_admission_needs_time_for_a_new_trial_to_reach_the_top_rung() -> None:
    assert POLICY.admits_new_trial(90.0, 10.0)  # 9 units * 10 s
    assert not POLICY.admits_new_trial(89.9, 10.0)
    assert POLICY.admits_new_trial(90.0, LinearCost(2.0, 4.0), group_size=2)  # 9 units * (2 + 4 * 2) s
    assert not POLICY.admits_new_trial(89.0, LinearCost(2.0, 4.0), group_size=2)
    assert POLICY.seconds_to_top_rung(9, 10.0) == 0.0
    assert POLICY.seconds_to_top_rung(10, 10.0) == 0.0


def test_with_time_to_spare_every_trial_is_kept_and_slots_are_refilled() -> None:
    trials = [TrialProgress("a", 3, 0.5), TrialProgress("b", 1, 0.6)]
    plan = POLICY.plan(trials, time_left_s=1000.0, seconds_per_unit=10.0)
    assert plan.keep == ("b", "a")
    assert plan.stop == ()
    assert plan.admit_new_trials
    assert plan.seconds_needed == 80.0


def test_near_the_deadline_the_best_trials_that_can_finish_get_the_freed_capacity() -> None:
    # Three trials at budget 5 need 4 more units; a group of B steps one unit in 2 + 4 B seconds.
    trials = [TrialProgress("a", 5, 0.7), TrialProgress("b", 5, 0.9), TrialProgress("c", 5, 0.8)]
    speed = LinearCost(fixed=2.0, per_trial=4.0)
    assert POLICY.plan(trials, 56.0, speed).keep == ("b", "c", "a")  # 4 * 14 s: all three finish
    plan = POLICY.plan(trials, 40.0, speed)  # only a group of two finishes: 4 * 10 s
    assert plan.keep == ("b", "c")
    assert [(d.trial_id, d.action, d.reason) for d in plan.stop] == [("a", "stop", "cannot_finish_before_deadline")]
    assert not plan.admit_new_trials


def test_a_worse_trial_closer_to_the_top_rung_may_take_the_last_capacity() -> None:
    # The top rung is 9; a group of B steps one unit in 5 B seconds; a group runs until its last member
    # reaches the top rung. best alone: 4 * 5 = 20 s; with next: 8 * 10 = 80 s; with late: 4 * 10 = 40 s.
    trials = [TrialProgress("best", 5, 0.9), TrialProgress("next", 1, 0.8), TrialProgress("late", 7, 0.1)]
    plan = POLICY.plan(trials, 40.0, LinearCost(0.0, 5.0))
    assert plan.keep == ("best", "late")


def test_the_best_trial_trains_on_even_if_it_cannot_finish() -> None:
    trials = [TrialProgress("a", 1, 0.5), TrialProgress("b", 1, 0.9)]
    plan = POLICY.plan(trials, time_left_s=-5.0, seconds_per_unit=1.0)
    assert plan.keep == ("b",)
    assert [d.trial_id for d in plan.stop] == ["a"]


def test_diverged_trials_stop_and_trials_without_values_rank_last() -> None:
    trials = [TrialProgress("new", 0), TrialProgress("nan", 3, math.nan), TrialProgress("ok", 3, 0.1)]
    plan = POLICY.plan(trials, 1000.0, 1.0)
    assert plan.keep == ("ok", "new")
    assert [(d.trial_id, d.reason) for d in plan.stop] == [("nan", "diverged")]
    assert POLICY.plan([], 10.0, 1.0).keep == ()


def test_min_mode_prefers_lower_values() -> None:
    policy = DeadlinePolicy(HalvingConfig("min", 1, 3, 9))
    plan = policy.plan([TrialProgress("a", 1, 0.9), TrialProgress("b", 1, 0.1)], 8.0, LinearCost(0.0, 1.0))
    assert plan.keep == ("b",)


@pytest.mark.parametrize("seconds", [0.0, -1.0, math.nan, math.inf])
def test_seconds_per_unit_must_be_positive_and_finite(seconds: float) -> None:
    with pytest.raises(ValueError, match=r"seconds per unit of budget must be a finite number > 0 \(for a group of 1"):
        POLICY.admits_new_trial(10.0, seconds)


def test_a_linear_speed_that_predicts_no_time_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"for a group of 1\), got 0\.0\. Pass the measured time of one epoch"):
        POLICY.plan([TrialProgress("a", 1, 0.1), TrialProgress("b", 1, 0.2)], 10.0, LinearCost(2.0, -2.0))


def test_time_left_and_trials_are_checked() -> None:
    with pytest.raises(ValueError, match=r"time_left_s is NaN\. Pass the seconds left until the deadline"):
        POLICY.plan([], math.nan, 1.0)
    with pytest.raises(TypeError, match=r"DeadlinePolicy.plan: budget must be an integer"):
        POLICY.plan([TrialProgress("a", 1.5, 0.1)], 10.0, 1.0)  # type: ignore[arg-type]


progress = st.builds(
    TrialProgress,
    trial_id=st.uuids().map(str),
    budget=st.integers(0, 12),
    value=st.one_of(st.none(), st.floats(-10, 10, allow_nan=False)),
)


@settings(max_examples=150, deadline=None)
@given(
    trials=st.lists(progress, max_size=12, unique_by=lambda t: t.trial_id),
    time_left=st.floats(-10, 500),
    fixed=st.floats(0.0, 5.0),
    per_trial=st.floats(0.1, 5.0),
)
def test_properties(trials: list[TrialProgress], time_left: float, fixed: float, per_trial: float) -> None:
    speed = LinearCost(fixed, per_trial)
    plan = POLICY.plan(trials, time_left, speed)
    assert plan == POLICY.plan(trials, time_left, speed)  # deterministic
    assert sorted(plan.keep + tuple(d.trial_id for d in plan.stop)) == sorted(t.trial_id for t in trials)
    if trials:
        assert plan.keep  # someone always trains on
    valued = [t for t in trials if t.value is not None]
    if valued:
        best = max(valued, key=lambda t: (t.value, t.budget, -trials.index(t)))
        # The best is considered first, so it is only stopped if it cannot finish even alone.
        assert best.trial_id in plan.keep or POLICY.seconds_to_top_rung(best.budget, speed) > time_left
    if len(plan.keep) > 1:
        assert plan.seconds_needed <= time_left  # everyone kept reaches the top rung in time


def test_each_trial_appears_once_with_a_real_value() -> None:
    with pytest.raises(
        ValueError, match=r"DeadlinePolicy.plan: each trial may appear once, got \['a'\] more than once"
    ):
        POLICY.plan([TrialProgress("a", 1, 0.1), TrialProgress("a", 2, 0.2)], 10.0, 1.0)
    with pytest.raises(TypeError, match=r"DeadlinePolicy.plan: the monitored value must be a real number"):
        POLICY.plan([TrialProgress("a", 1, "0.1")], 10.0, 1.0)  # type: ignore[arg-type]
