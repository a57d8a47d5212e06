import math

import pytest

from lightning_hydro.sweeper.planning.samplers import GridSampler, RandomSampler, SamplerFeedback, make_sampler
from lightning_hydro.sweeper.planning.search_space import parse_search_space

SPACE = parse_search_space(
    [
        "model.lr=tag(log, interval(1e-4, 1))",
        "model.hidden_dim=tag(int, interval(8, 64))",
        "data.batch_size=32,64,128",
    ]
)


def test_grid_enumerates_in_order_and_subsets_with_seed():
    space = parse_search_space(["a=1,2", "b=x,y,z"])
    grid = GridSampler(space, seed=0)
    assert grid.max_trials == 6
    assert [c.values for c in grid.ask(range(6))][:3] == [
        {"a": 1, "b": "x"},
        {"a": 1, "b": "y"},
        {"a": 1, "b": "z"},
    ]
    small = GridSampler(space, seed=0, n_trials=4)
    again = GridSampler(space, seed=0, n_trials=4)
    assert small.max_trials == 4
    assert [c.texts for c in small.ask(range(4))] == [c.texts for c in again.ask(range(4))]
    with pytest.raises(ValueError, match="the grid has only 4 points"):
        small.ask([4])


def test_grid_rejects_intervals():
    with pytest.raises(
        ValueError, match=r"sampler 'grid' needs discrete values, but 'model.lr' is a continuous interval"
    ):
        GridSampler(SPACE, seed=0)


def test_random_is_seeded_in_bounds_and_resumable():
    first = RandomSampler(SPACE, seed=3).ask(range(50))
    assert [c.texts for c in first] == [c.texts for c in RandomSampler(SPACE, seed=3).ask(range(50))]
    assert [c.texts for c in first] != [c.texts for c in RandomSampler(SPACE, seed=4).ask(range(50))]
    for c in first:
        assert 1e-4 <= c.values["model.lr"] <= 1
        assert isinstance(c.values["model.hidden_dim"], int)
        assert 8 <= c.values["model.hidden_dim"] <= 64
        assert c.values["data.batch_size"] in (32, 64, 128)
    # Log-uniform: about half the draws fall below the geometric midpoint 1e-2.
    assert 10 < sum(c.values["model.lr"] < 1e-2 for c in first) < 40
    resumed = RandomSampler(SPACE, seed=3)
    resumed.skip(20)
    assert [c.texts for c in resumed.ask(range(20, 50))] == [c.texts for c in first[20:]]


def test_tpe_asks_tells_and_replays():
    space = parse_search_space(["x=interval(-2, 2)", "c=choice(a, b)"])
    tpe = make_sampler("tpe", space, seed=0, mode="min")
    for round_ in range(3):
        ids = list(range(round_ * 8, round_ * 8 + 8))
        for tid, conf in zip(ids, tpe.ask(ids)):
            value = (conf.values["x"] - 1) ** 2 + (0.5 if conf.values["c"] == "a" else 0.0)
            status = "stopped" if tid % 5 == 0 else "completed"
            tpe.tell(tid, conf, SamplerFeedback(status, value, budget=3))
    # A trial told without having been asked (finished before a resume) is added as a finished trial.
    conf = tpe.ask([100])[0]
    fresh = make_sampler("tpe", space, seed=0, mode="min")
    fresh.tell(100, conf, SamplerFeedback("completed", 0.1, budget=3))
    fresh.tell(101, conf, SamplerFeedback("stopped", 0.2, budget=1))
    fresh.tell(102, conf, SamplerFeedback("diverged", math.nan, budget=1))
    study = fresh._study  # the replayed trials are in Optuna's study
    assert [t.state.name for t in study.trials] == ["COMPLETE", "PRUNED", "FAIL"]
    best = min(tpe._study.trials, key=lambda t: t.value if t.value is not None else math.inf)
    assert abs(best.params["x"] - 1) < 1.0


def test_unknown_sampler():
    with pytest.raises(ValueError, match=r"unknown sampler 'bayes'; expected one of \['grid', 'random', 'tpe'\]. Fix"):
        make_sampler("bayes", SPACE, seed=0, mode="max")
