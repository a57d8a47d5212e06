import copy
import math
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_hydro.stopping import (
    AsyncSuccessiveHalving,
    Decision,
    HalvingConfig,
    MemoryRungStore,
    SqliteRungStore,
    StoreSettingsMismatchError,
    SuccessiveHalvingRule,
    TrialId,
)

CONFIG = HalvingConfig("min", grace_period=1, reduction_factor=3, max_t=9)


def test_asynchronous_arrivals_hand_computed() -> None:
    asha = AsyncSuccessiveHalving(CONFIG)
    a, b, c, d, e = (asha.report(t, 1, v) for t, v in [("a", 5.0), ("b", 3.0), ("c", 4.0), ("d", 3.5), ("e", 1.0)])
    assert (a.action, a.reason, a.cutoff) == ("continue", "first_at_rung", None)
    assert (b.action, b.cutoff) == ("continue", 5.0)  # quantile of [5] is 5
    # prior [5, 3] -> sorted losses 3, 5; the 2/3 quantile of the scores -5, -3 is -5 + 2/3 * 2 = -11/3.
    assert (c.action, c.reason, c.cutoff) == ("stop", "below_cutoff", pytest.approx(11 / 3))
    # prior [5, 3, 4] -> scores -5, -4, -3; p = 4/3: -4 + 1/3 * 1 = -11/3 again; 3.5 passes.
    assert (d.action, d.cutoff) == ("continue", pytest.approx(11 / 3))
    assert e.action == "continue"
    assert [r.trial_id for r in asha.records()] == ["a", "b", "c", "d", "e"]
    # All five: scores -5, -4, -3.5, -3, -1; p = 8/3: -3.5 + 2/3 * 0.5 = -19/6.
    assert asha.cutoff(1) == pytest.approx(19 / 6)
    assert asha.cutoff(3) is None


def test_budgets_between_rungs_past_rungs_and_at_max_t() -> None:
    asha = AsyncSuccessiveHalving(CONFIG)
    assert asha.report("a", 0, 1.0).reason == "not_at_rung"
    assert asha.report("a", 1, 1.0).reason == "first_at_rung"
    assert asha.report("a", 2, 0.9) == Decision("a", "continue", "not_at_rung", 2, value=0.9)
    assert asha.report("a", 3, 0.8).milestone == 3
    assert asha.report("a", 9, 0.1) == Decision("a", "complete", "reached_max_t", 9, 9, 2, 0.1, None)
    assert asha.report("a", 10, 0.1).action == "complete"
    assert len(asha.records()) == 3


def test_a_trial_validated_every_few_epochs_is_recorded_at_the_highest_rung_reached() -> None:
    asha = AsyncSuccessiveHalving(CONFIG)
    assert asha.report("a", 2, 1.0).milestone == 1
    assert asha.report("a", 4, 1.0).milestone == 3
    assert [(r.milestone, r.budget) for r in asha.records()] == [(1, 2), (3, 4)]


def test_diverged_trials_stop_at_any_budget() -> None:
    asha = AsyncSuccessiveHalving(CONFIG)
    assert asha.report("a", 1, math.nan).reason == "diverged"  # even as the first at the rung
    assert asha.report("b", 2, math.inf).reason == "diverged"  # even between rungs
    assert asha.report("c", 9, -math.inf).action == "stop"  # even at max_t


def test_a_replayed_report_gets_its_first_decision_and_adds_no_record() -> None:
    asha = AsyncSuccessiveHalving(CONFIG)
    first = [asha.report(t, 1, v) for t, v in [("a", 1.0), ("b", 2.0), ("c", 3.0), ("d", 0.5)]]
    replayed = AsyncSuccessiveHalving(CONFIG, asha.store).report("c", 1, 3.0)  # fresh object: no cache
    assert replayed == first[2]
    assert replayed.stopped
    assert len(asha.records()) == 4


def test_batch_is_judged_against_everything_recorded_up_to_it() -> None:
    asha = AsyncSuccessiveHalving(HalvingConfig("max", 1, 3, 9))
    decisions = asha.report_batch([(t, 1, float(t)) for t in range(9)])
    assert [d.action for d in decisions] == ["stop"] * 6 + ["continue"] * 3
    # A later single arrival is judged against all nine: p = 2/3 * 8 = 16/3, cutoff 5 + 1/3.
    assert asha.report(9, 1, 5.3).action == "stop"
    assert asha.report(10, 1, 5.4).action == "continue"


def test_batch_may_mix_rungs_and_rejects_repeated_trials() -> None:
    asha = AsyncSuccessiveHalving(CONFIG)
    asha.report_batch([("a", 1, 1.0), ("b", 1, 2.0)])
    # "a" is alone at rung 3 in its batch: judged against itself, it continues.
    decisions = asha.report_batch([("a", 3, 1.0), ("c", 1, 0.5), ("b", 2, 2.0)])
    assert [(d.milestone, d.reason) for d in decisions] == [
        (3, "at_or_above_cutoff"), (1, "at_or_above_cutoff"), (None, "not_at_rung"),
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"each trial may report once per batch, got \['a'\] more than once"):
        asha.report_batch([("a", 3, 1.0), ("a", 4, 1.0)])


def test_report_checks_its_arguments() -> None:
    asha = AsyncSuccessiveHalving(CONFIG)
    with pytest.raises(TypeError, match=r"AsyncSuccessiveHalving.report: the monitored value must be a real number"):
        asha.report("a", 1, "0.5")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"AsyncSuccessiveHalving.report_batch: budget must be an integer"):
        asha.report_batch([("a", 1.5, 0.5)])  # type: ignore[list-item]


def test_processes_with_other_settings_cannot_share_a_namespace() -> None:
    store = MemoryRungStore()
    AsyncSuccessiveHalving(CONFIG, store)
    with pytest.raises(
        StoreSettingsMismatchError,
        match=r"namespace 'default' \(bracket 0\) in memory holds records made with .*'mode': 'min'.* "
        r"but this rule uses .*'mode': 'max'.*give this sweep its own namespace",
    ):
        AsyncSuccessiveHalving(HalvingConfig("max", 1, 3, 9), store)


def _arrivals(count: int, seed: int) -> list[tuple[str, int, float]]:
    """Reports of `count` trials reaching rungs in an interleaved order (each trial's budgets increase)."""
    generator = random.Random(seed)
    pending = {f"t{i}": [1, 3, 9] for i in range(count)}
    arrivals = []
    while pending:
        trial = generator.choice(sorted(pending))
        budget = pending[trial].pop(0)
        arrivals.append((trial, budget, round(generator.random(), 3)))
        if not pending[trial]:
            del pending[trial]
    return arrivals


def _run(asha: AsyncSuccessiveHalving, arrivals: list[tuple[str, int, float]], stopped: set[str]) -> list[Decision]:
    decisions = []
    for trial, budget, value in arrivals:
        if trial in stopped:
            continue
        decision = asha.report(trial, budget, value)
        decisions.append(decision)
        if decision.stopped:
            stopped.add(trial)
    return decisions


def test_resume_from_state_dict_gives_the_uninterrupted_decisions() -> None:
    arrivals = _arrivals(20, seed=3)
    uninterrupted = _run(AsyncSuccessiveHalving(CONFIG), arrivals, set())
    first, stopped = AsyncSuccessiveHalving(CONFIG), set[str]()
    head = _run(first, arrivals[:25], stopped)
    resumed = AsyncSuccessiveHalving(CONFIG)
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    assert head + _run(resumed, arrivals[25:], stopped) == uninterrupted


def test_resume_after_a_crash_replays_reports_already_in_a_shared_store(tmp_path: Path) -> None:
    arrivals = _arrivals(12, seed=5)
    uninterrupted = _run(AsyncSuccessiveHalving(CONFIG), arrivals, set())
    path = tmp_path / "asha.db"
    crashed, stopped = AsyncSuccessiveHalving(CONFIG, path), set[str]()
    head = _run(crashed, arrivals[:10], stopped)
    checkpoint = copy.deepcopy(crashed.state_dict())  # saved after 10 arrivals ...
    _run(crashed, arrivals[10:18], set(stopped))  # ... then 8 more were recorded before the crash
    resumed = AsyncSuccessiveHalving(CONFIG, path)
    resumed.load_state_dict(checkpoint)
    assert head + _run(resumed, arrivals[10:], stopped) == uninterrupted
    assert len(SqliteRungStore(path).records()) == len(uninterrupted)  # the replays added nothing


def test_load_state_dict_rejects_other_settings_and_stores() -> None:
    state = AsyncSuccessiveHalving(CONFIG).state_dict()
    with pytest.raises(ValueError, match=r"checkpoint was made with .* \(bracket 0\), but this rule has"):
        AsyncSuccessiveHalving(CONFIG, bracket=1).load_state_dict(state)


finite_or_diverged = st.one_of(
    st.sampled_from([0.0, 1.0, 2.0, math.nan, math.inf]),  # ties and divergence
    st.floats(-100, 100, allow_nan=False, allow_infinity=False),
)


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(finite_or_diverged, min_size=1, max_size=40),
    eta=st.integers(2, 5),
    mode=st.sampled_from(["min", "max"]),
)
def test_a_batch_on_an_empty_rung_decides_like_synchronous_halving(values: list[float], eta: int, mode: str) -> None:
    config = HalvingConfig(mode, 1, eta, eta**3)  # type: ignore[arg-type]
    cohort = dict(enumerate(values))
    synchronous = SuccessiveHalvingRule(config).report_rung(cohort, budget=1)
    batch = AsyncSuccessiveHalving(config).report_batch([(t, 1, v) for t, v in cohort.items()])
    assert [d.action for d in batch] == [synchronous[t].action for t in cohort]
    assert [d.reason for d in batch] == [synchronous[t].reason for t in cohort]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), n_trials=st.integers(1, 30), eta=st.integers(2, 4))
def test_a_fused_group_reporting_in_batches_equals_synchronous_halving_at_every_rung(
    seed: int, n_trials: int, eta: int
) -> None:
    config = HalvingConfig("max", 1, eta, eta**2 + 1)
    generator = random.Random(seed)
    synchronous, asha = SuccessiveHalvingRule(config), AsyncSuccessiveHalving(config)
    alive: list[TrialId] = list(range(n_trials))
    for budget in range(1, config.max_t + 1):
        values = {t: float(generator.randint(0, 5)) for t in alive}  # small range: many ties
        expected = synchronous.report_rung(values, budget)
        got = asha.report_batch([(t, budget, v) for t, v in values.items()])
        assert [d.action for d in got] == [expected[t].action for t in values]
        alive = [d.trial_id for d in got if d.action == "continue"]


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.floats(-100, 100, allow_nan=False), min_size=1, max_size=30, unique=True),
    eta=st.integers(2, 5),
    mode=st.sampled_from(["min", "max"]),
)
def test_properties_best_never_stopped_fraction_and_determinism(values: list[float], eta: int, mode: str) -> None:
    config = HalvingConfig(mode, 1, eta, eta**2)  # type: ignore[arg-type]
    arrivals = [(f"t{i}", 1, v) for i, v in enumerate(values)]
    decisions = _sequential(config, arrivals)
    best = (min if mode == "min" else max)(range(len(values)), key=values.__getitem__)
    assert decisions[best].action == "continue"
    assert decisions == _sequential(config, arrivals)  # same arrival order, same decisions
    batch = AsyncSuccessiveHalving(config).report_batch(arrivals)
    assert sum(d.action == "continue" for d in batch) == math.ceil(len(values) / eta)


def _sequential(config: HalvingConfig, arrivals: list[tuple[str, int, float]]) -> list[Decision]:
    asha = AsyncSuccessiveHalving(config)
    return [asha.report(*arrival) for arrival in arrivals]


def test_a_deep_copy_shares_a_file_store_but_not_its_connection(tmp_path: Path) -> None:
    asha = AsyncSuccessiveHalving(CONFIG, tmp_path / "asha.db")
    asha.report("a", 1, 1.0)
    copied = copy.deepcopy(asha)  # Lightning may deep-copy callbacks
    assert copied.report("b", 1, 2.0).reason == "below_cutoff"  # judged against "a", recorded before the copy
    assert len(asha.records()) == 2
