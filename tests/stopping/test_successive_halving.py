import copy
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_hydro.stopping import HalvingConfig, SuccessiveHalvingRule, TrialId, summarize_budget
from lightning_hydro.stopping.decision import Action
from lightning_hydro.stopping.halving_config import keep_count

CONFIG = HalvingConfig("min", grace_period=1, reduction_factor=3, max_t=9)


def test_27_trials_hand_computed() -> None:
    halving = SuccessiveHalvingRule(CONFIG)
    used: dict[int, int] = {}
    at_rung_1 = halving.report_rung({trial: float(trial) for trial in range(27)}, budget=1)
    assert [t for t, d in at_rung_1.items() if d.action == "continue"] == list(range(9))
    assert {d.cutoff for d in at_rung_1.values()} == {8.0}
    used |= {t: 1 for t, d in at_rung_1.items() if d.stopped}
    assert halving.report_rung({t: 0.0 for t in range(9)}, budget=2)[0].reason == "not_at_rung"
    # At rung 3 the order reverses: the higher ids are now better.
    at_rung_3 = halving.report_rung({t: 10.0 - t for t in range(9)}, budget=3)
    assert [t for t, d in at_rung_3.items() if d.action == "continue"] == [6, 7, 8]
    assert at_rung_3[5].describe() == "trial 5: stop at budget 3 (rung 1): value 5.0 is worse than the cutoff 4.0"
    used |= {t: 3 for t, d in at_rung_3.items() if d.stopped}
    at_max_t = halving.report_rung({6: 0.3, 7: 0.2, 8: 0.1}, budget=9)
    assert {d.action for d in at_max_t.values()} == {"complete"}
    assert {d.reason for d in at_max_t.values()} == {"reached_max_t"}
    used |= dict.fromkeys(at_max_t, 9)
    assert halving.alive == []
    summary = summarize_budget(used, max_t=9)
    assert (summary.spent, summary.exhaustive) == (63, 243)


def test_top_rung_below_max_t_cuts_then_survivors_complete() -> None:
    halving = SuccessiveHalvingRule(HalvingConfig("max", 1, 2, 5))  # milestones 1, 2, 4
    halving.report_rung({"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}, budget=1)
    assert halving.report_rung({"c": 1.0, "d": 2.0}, budget=2)["d"].action == "continue"
    assert halving.report_rung({"d": 0.5}, budget=4)["d"].reason == "at_or_above_cutoff"
    assert halving.alive == ["d"]
    assert halving.report_rung({"d": 0.5}, budget=5)["d"].action == "complete"


def test_ties_at_the_boundary_are_all_kept() -> None:
    decisions = SuccessiveHalvingRule(CONFIG).report_rung({"a": 1.0, "b": 2.0, "c": 2.0, "d": 2.0, "e": 5.0}, budget=1)
    assert [t for t, d in decisions.items() if d.action == "continue"] == ["a", "b", "c", "d"]


def test_diverged_trials_count_in_n_but_are_never_kept() -> None:
    values = {0: math.nan, 1: math.inf, 2: 3.0, 3: math.nan}
    decisions = SuccessiveHalvingRule(CONFIG).report_rung(values, budget=1)  # keep ceil(4/3) = 2
    assert {t: d.reason for t, d in decisions.items()} == {
        0: "diverged", 1: "diverged", 2: "at_or_above_cutoff", 3: "diverged",
    }  # fmt: skip


def test_a_diverged_value_between_rungs_stops_the_trial() -> None:
    halving = SuccessiveHalvingRule(CONFIG)
    halving.report_rung({"a": 1.0, "b": 2.0}, budget=1)
    assert halving.report_rung({"a": math.nan}, budget=2)["a"].reason == "diverged"


def test_floor_rounding() -> None:
    decisions = SuccessiveHalvingRule(CONFIG, rounding="floor").report_rung({t: float(t) for t in range(10)}, 1)
    assert sum(d.action == "continue" for d in decisions.values()) == 3


def test_rung_skipped_by_sparse_validation_is_judged_at_the_next_report() -> None:
    halving = SuccessiveHalvingRule(CONFIG)
    first = halving.report_rung({t: float(t) for t in range(9)}, budget=2)  # validated every 2 epochs
    assert first[0].milestone == 1
    assert sum(d.action == "continue" for d in first.values()) == 3
    assert halving.report_rung({0: 0.0, 1: 1.0, 2: 2.0}, budget=4)[2].reason == "below_cutoff"


def test_only_alive_trials_may_report_and_missing_ones_leave_the_cohort() -> None:
    halving = SuccessiveHalvingRule(CONFIG)
    halving.report_rung({t: float(t) for t in range(9)}, budget=1)
    with pytest.raises(ValueError, match=r"trials \[5\] are not alive in this cohort .*Report only the alive trials"):
        halving.report_rung({0: 1.0, 5: 1.0}, budget=3)
    halving.report_rung({0: 1.0, 1: 2.0}, budget=3)  # trial 2 left (e.g. removed as diverged)
    assert halving.alive == [0]


def test_rounding_is_checked() -> None:
    with pytest.raises(ValueError, match=r"rounding must be 'ceil' or 'floor', got 'up'"):
        SuccessiveHalvingRule(CONFIG, rounding="up")  # type: ignore[arg-type]


def _drive(halving: SuccessiveHalvingRule, budgets: list[int]) -> list[dict[TrialId, Action]]:
    """Report every alive trial (all 27 at first) at each budget; values depend on trial and budget."""
    actions = []
    for budget in budgets:
        alive = halving.alive if halving.alive is not None else list(range(27))
        values = {t: float((7 * int(t) + budget) % 29) for t in alive}
        actions.append({t: d.action for t, d in halving.report_rung(values, budget).items()})
    return actions


def test_resume_from_state_dict_gives_the_uninterrupted_decisions() -> None:
    uninterrupted = _drive(SuccessiveHalvingRule(CONFIG), [1, 2, 3, 4, 9])
    first = SuccessiveHalvingRule(CONFIG)
    head = _drive(first, [1, 2, 3])
    state = copy.deepcopy(first.state_dict())
    resumed = SuccessiveHalvingRule(CONFIG)
    resumed.load_state_dict(state)
    assert resumed.records() == first.records()
    assert resumed.alive == first.alive
    assert head + _drive(resumed, [4, 9]) == uninterrupted


def test_load_state_dict_rejects_other_settings() -> None:
    state = SuccessiveHalvingRule(CONFIG).state_dict()
    with pytest.raises(ValueError, match=r"checkpoint was made with .*'max_t': 9.* but this rule has .*'max_t': 27"):
        SuccessiveHalvingRule(HalvingConfig("min", 1, 3, 27)).load_state_dict(state)


distinct_values = st.lists(
    st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False), min_size=1, max_size=60, unique=True
)


@settings(max_examples=150, deadline=None)
@given(values=distinct_values, eta=st.integers(2, 5), mode=st.sampled_from(["min", "max"]))
def test_properties_best_kept_fraction_promoted_and_determinism(values: list[float], eta: int, mode: str) -> None:
    config = HalvingConfig(mode, 1, eta, eta**3)  # type: ignore[arg-type]
    cohort = dict(enumerate(values))
    decisions = SuccessiveHalvingRule(config).report_rung(cohort, budget=1)
    best = (min if mode == "min" else max)(cohort, key=cohort.__getitem__)
    assert decisions[best].action == "continue"
    promoted = [t for t, d in decisions.items() if d.action == "continue"]
    assert len(promoted) == keep_count(len(values), eta) == math.ceil(len(values) / eta)
    floor_promoted = SuccessiveHalvingRule(config, rounding="floor").report_rung(cohort, budget=1)
    assert sum(d.action == "continue" for d in floor_promoted.values()) == max(1, len(values) // eta)
    assert SuccessiveHalvingRule(config).report_rung(cohort, budget=1) == decisions
