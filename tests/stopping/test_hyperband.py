import copy
import random
from collections import Counter
from pathlib import Path

import pytest

from lightning_hydro.stopping import HalvingConfig, HyperbandRule, SuccessiveHalvingRule, hyperband_brackets
from lightning_hydro.stopping.hyperband import BracketOrder, assign_to_brackets, bracket_for_position

R81 = HalvingConfig("max", grace_period=1, reduction_factor=3, max_t=81)


def _table(config: HalvingConfig, rounding: str) -> dict[int, list[tuple[int, int]]]:
    brackets = hyperband_brackets(config, rounding=rounding)  # type: ignore[arg-type]
    return {b.s: [(rung.trials, rung.budget) for rung in b.rungs] for b in brackets}


def test_floor_rounding_reproduces_li_et_al_table_1() -> None:
    assert _table(R81, "floor") == {
        4: [(81, 1), (27, 3), (9, 9), (3, 27), (1, 81)],
        3: [(34, 3), (11, 9), (3, 27), (1, 81)],
        2: [(15, 9), (5, 27), (1, 81)],
        1: [(8, 27), (2, 81)],
        0: [(5, 81)],
    }


def test_default_ceil_rounding_keeps_what_asha_batches_keep() -> None:
    table = _table(R81, "ceil")
    assert table[3] == [(34, 3), (12, 9), (4, 27), (2, 81)]
    assert table[1] == [(8, 27), (3, 81)]
    assert table[4] == _table(R81, "floor")[4]  # powers of eta round the same either way


def test_bracket_attributes_and_budget() -> None:
    bracket = hyperband_brackets(R81)[1]
    assert (bracket.s, bracket.trials, bracket.grace_period) == (3, 34, 3)
    assert bracket.config == R81.with_grace_period(3)
    assert bracket.budget.spent == 34 * 3 + 12 * 6 + 4 * 18 + 2 * 54


def test_brackets_anchor_on_milestones_when_max_t_is_not_one() -> None:
    brackets = hyperband_brackets(HalvingConfig("min", 1, 3, 10))
    assert [(b.s, b.trials, b.grace_period) for b in brackets] == [(2, 9, 1), (1, 5, 3), (0, 3, 9)]
    with pytest.warns(DeprecationWarning, match=r"HyperbandBracket.min_budget is renamed grace_period"):
        assert [b.min_budget for b in brackets] == [1, 3, 9]
    assert brackets[-1].config.milestones == (9,)


def test_sequential_and_interleaved_dealing_give_each_bracket_its_n_per_iteration() -> None:
    brackets = hyperband_brackets(R81)
    per_iteration = sum(b.trials for b in brackets)
    orders: tuple[BracketOrder, ...] = ("sequential", "interleaved")
    for order in orders:
        counts = Counter(bracket_for_position(i, brackets, order) for i in range(2 * per_iteration))
        assert counts == {b.s: 2 * b.trials for b in brackets}
    first_group = Counter(bracket_for_position(i, brackets, "interleaved") for i in range(16))
    assert len(first_group) >= 3  # a fused group of 16 mixes brackets
    assert assign_to_brackets(["a", "b"], brackets)[4] == ["a", "b"]


def test_order_is_checked() -> None:
    with pytest.raises(ValueError, match=r"order must be 'sequential' or 'interleaved', got 'random'"):
        HyperbandRule(R81, order="random")  # type: ignore[arg-type]


def test_trials_must_be_added_once_before_they_report() -> None:
    hyperband = HyperbandRule(R81)
    hyperband.add_trial("a")
    with pytest.raises(ValueError, match=r"trial 'a' is already in bracket 4\. Add each trial once"):
        hyperband.add_trial("a")
    with pytest.raises(ValueError, match=r"HyperbandRule.report: trial 'b' has no bracket\. Call add_trial\('b'\)"):
        hyperband.report("b", 1, 0.5)
    assert hyperband.add_trial("b", position=81).s == 3  # a process passes its job number
    assert hyperband.assignments == {"a": 4, "b": 3}


def test_a_bracket_reporting_together_runs_synchronous_halving() -> None:
    config = HalvingConfig("max", 1, 3, 9)
    hyperband = HyperbandRule(config)
    trials = [f"t{i}" for i in range(9)]
    for trial in trials:
        assert hyperband.add_trial(trial).s == 2
    values = {t: random.Random(t).random() for t in trials}
    expected = SuccessiveHalvingRule(config).report_rung(values, 1)
    decisions = hyperband.report_batch([(t, 1, v) for t, v in values.items()])
    assert [d.action for d in decisions] == [expected[t].action for t in trials]


def test_report_batch_spans_brackets_and_keeps_input_order(tmp_path: Path) -> None:
    hyperband = HyperbandRule(HalvingConfig("min", 1, 3, 9), tmp_path / "hb.db", order="interleaved")
    for trial in "abcd":
        hyperband.add_trial(trial)  # brackets 2, 1, 2, 0
    decisions = hyperband.report_batch([("a", 3, 1.0), ("b", 3, 2.0), ("c", 1, 3.0), ("d", 3, 4.0)])
    assert [(d.trial_id, d.milestone) for d in decisions] == [("a", 3), ("b", 3), ("c", 1), ("d", None)]
    assert [r.bracket for r in hyperband.store.records()] == [2, 2, 1]


def test_resume_from_state_dict_gives_the_uninterrupted_decisions() -> None:
    config = HalvingConfig("min", 1, 3, 9)
    generator = random.Random(7)
    events = [(f"t{i}", budget, generator.random()) for budget in (1, 3, 9) for i in range(17)]

    def run(hyperband: HyperbandRule, events: list[tuple[str, int, float]]) -> list[str]:
        actions: list[str] = []
        for trial, budget, value in events:
            if trial not in hyperband.assignments:
                hyperband.add_trial(trial)
            actions.append(hyperband.report(trial, budget, value).action)
        return actions

    uninterrupted = run(HyperbandRule(config), events)
    first = HyperbandRule(config)
    head = run(first, events[:20])
    resumed = HyperbandRule(config)
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    assert resumed.assignments == first.assignments
    assert head + run(resumed, events[20:]) == uninterrupted


def test_load_state_dict_rejects_other_settings() -> None:
    state = HyperbandRule(R81).state_dict()
    with pytest.raises(
        ValueError, match=r"HyperbandRule.load_state_dict: the checkpoint was made with .*order='sequential'"
    ):
        HyperbandRule(R81, order="interleaved").load_state_dict(state)
