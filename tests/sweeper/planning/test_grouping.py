"""Group planning: the entry's padded-or-plain choice, which keys pad, how groups are cut, how a refused one splits."""

from __future__ import annotations

from lightning_hydro.stacking.width_plan import WidthPaddingError
from lightning_hydro.sweeper.planning.grouping import (
    GroupPlanner,
    fused_options,
    is_width_refusal,
    launch_report,
    plan_padded_groups,
    split_refused,
    width_keys,
)
from lightning_hydro.sweeper.planning.search_space import Configuration
from lightning_hydro.sweeper.planning.settings import SweepSettings
from lightning_hydro.sweeper.planning.sweep_state import SweepState
from lightning_hydro.sweeper.planning.trial_groups import Trial, TrialGroup


def _trials(rows: list[dict[str, object]]) -> list[Trial]:
    return [Trial(i, Configuration(dict(r), {k: str(v) for k, v in r.items()})) for i, r in enumerate(rows)]


def test_only_integer_model_keys_pad():
    trials = _trials([{"model.h": 8, "data.batch_size": 32, "model.act": "relu", "model.p": 0.5}])
    assert width_keys(trials, ["model.h", "data.batch_size", "model.act", "model.p"]) == ["model.h"]


def test_widths_are_cut_by_padded_cost_within_the_other_partitions():
    rows = [{"model.h": h, "data.bs": bs} for h, bs in [(32, 8), (512, 8), (40, 8), (32, 16), (48, 8)]]
    groups, overheads = plan_padded_groups(
        _trials(rows),
        non_fusible=["model.h", "data.bs"],
        widths=["model.h"],
        fusion_limit=lambda p: 8,
        refill=False,
        max_overhead=0.5,
    )
    assert [(g.trial_ids, g.partition) for g in groups] == [
        ((0, 2, 4), (("data.bs", "8"),)),
        ((1,), (("data.bs", "8"),)),
        ((3,), (("data.bs", "16"),)),
    ]
    assert overheads["group_0001"] == 0.0
    assert 0 < overheads["group_0000"] <= 0.5
    report = launch_report(groups, ["model.h"], overheads)
    assert "pads the widths model.h" in report
    assert "group_0000: 3 trials, +" in report


def test_the_fusion_limit_caps_groups_unless_slots_refill():
    trials = _trials([{"model.h": 16} for _ in range(5)])
    kwargs = {"non_fusible": ["model.h"], "widths": ["model.h"], "fusion_limit": lambda p: 2, "max_overhead": 1.0}
    capped, _ = plan_padded_groups(trials, refill=False, **kwargs)  # type: ignore[arg-type]
    assert [len(g.trial_ids) for g in capped] == [2, 2, 1]
    refilled, _ = plan_padded_groups(trials, refill=True, **kwargs)  # type: ignore[arg-type]
    assert [(len(g.trial_ids), g.slots) for g in refilled] == [(5, 2)]


def test_jobs_pad_only_when_widths_differ():
    same, mixed = _trials([{"model.h": 8}, {"model.h": 8}]), _trials([{"model.h": 8}, {"model.h": 16}])
    assert fused_options({"backend": "vmap"}, same, ["model.h"]) == {"backend": "vmap"}
    assert fused_options({"backend": "vmap"}, mixed, ["model.h"]) == {"backend": "vmap", "pad_widths": True}


def test_a_refused_group_splits_into_identical_widths():
    trials = _trials([{"model.h": 8, "model.o": 10}, {"model.h": 8, "model.o": 12}, {"model.h": 16, "model.o": 10}])
    group = TrialGroup("group_0003", "search", (0, 1, 2), 3, (("data.bs", "8"),))
    parts = split_refused(group, trials, ["model.h", "model.o"])
    assert [(g.group_id, g.trial_ids, g.slots) for g in parts] == [
        ("group_0003_w0", (0,), 1),
        ("group_0003_w1", (1,), 1),
        ("group_0003_w2", (2,), 1),
    ]
    assert parts[1].partition == (("data.bs", "8"), ("model.h", "8"), ("model.o", "12"))
    assert is_width_refusal(WidthPaddingError("x"))
    assert is_width_refusal(RuntimeError("... zero-padding would not compute exactly: module '2' ..."))
    assert not is_width_refusal(RuntimeError("CUDA out of memory"))


WIDTHS = [{"model.h": h, "data.bs": 8} for h in (32, 40, 512, 48)]


def _planner(tmp_path, *, continuous=False, **settings):
    settings = SweepSettings.from_config(n_trials=4, non_fusible=["model.h", "data.bs"], fusion_limit=4, **settings)
    state = SweepState.open(tmp_path, settings.request([]))
    return GroupPlanner(settings, state, ["model.h", "data.bs"], continuous=continuous), state


def test_the_planner_pads_widths_into_groups_by_cost_and_adds_them_to_the_plan(tmp_path):
    planner, state = _planner(tmp_path)
    trials = _trials(WIDTHS)
    assert planner.choose_widths(trials) == ["model.h"]
    assert planner.splitting_keys() == ["data.bs"]
    groups = planner.plan(trials, n_target=4)
    assert [g.trial_ids for g in groups] == [(0, 1, 3), (2,)]  # similar widths together, 512 alone
    assert state.groups == groups
    assert sorted(state.trials) == [0, 1, 2, 3]


def test_the_planner_keeps_widths_apart_without_padding_or_in_a_sweep_wide_search(tmp_path):
    for planner, _ in (_planner(tmp_path / "off", pad_widths=False), _planner(tmp_path / "wide", continuous=True)):
        trials = _trials(WIDTHS)
        assert planner.choose_widths(trials) == []
        assert planner.splitting_keys() == ["model.h", "data.bs"]
        groups = planner.plan(trials, n_target=8)
        assert sorted(g.trial_ids for g in groups) == [(0,), (1,), (2,), (3,)]  # one partition per width
    # the sweep-wide search gives each partition's group its share of the trials not asked yet
    assert [g.slots for g in groups] == [2, 2, 2, 2]
    assert sum(planner.state.quotas.values()) == 8
