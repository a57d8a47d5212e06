import pytest

from lightning_hydro.sweeper.group_spec import write_group_result
from lightning_hydro.sweeper.planning.search_space import Configuration
from lightning_hydro.sweeper.planning.sweep_state import SweepState
from lightning_hydro.sweeper.planning.trial_groups import Trial, TrialGroup


def test_roundtrip_and_completion(tmp_path):
    state = SweepState.open(tmp_path, {"sampler": "random", "n_trials": 2})
    trials = [
        Trial(
            0,
            Configuration({"model.lr": 0.1, "data.batch_size": 32}, {"model.lr": "0.1", "data.batch_size": "32"}),
        )
    ]
    group = TrialGroup("group_0000", "search", (0,), 1, (("data.batch_size", "32"),))
    state.add(trials, [group])
    state.set_fusion_limit(group.partition, 7)

    loaded = SweepState.open(tmp_path, {"sampler": "random", "n_trials": 2})
    assert loaded.trials == state.trials
    assert loaded.groups == [group]
    assert loaded.fusion_limit(group.partition) == 7
    assert loaded.result(group) is None
    write_group_result(loaded.job_dir(group), {"trials": {"0": {"status": "completed"}}})
    assert loaded.result(group) == {"trials": {"0": {"status": "completed"}}}
    assert loaded.groups_of_kind("retrain") == []


def test_a_different_sweep_in_the_same_directory_is_refused(tmp_path):
    SweepState.open(tmp_path, {"sampler": "random", "n_trials": 2}).save()
    with pytest.raises(
        ValueError,
        match=r"holds a different sweep \(it differs in: n_trials, sampler\)\. "
        r"Re-run with the same settings.*use another hydra.sweep.dir or delete",
    ):
        SweepState.open(tmp_path, {"sampler": "grid", "n_trials": 3})
