"""The group spec a job reads: early-stopping settings under the callbacks' names, old names still read."""

import dataclasses
import warnings

import pytest

from lightning_hydro.sweeper.group_spec import EarlyStoppingSpec, GroupSpec, TrialSpec
from lightning_hydro.sweeper.job.early_stopping import build_stopping_callback


def test_a_group_spec_round_trips_with_the_callbacks_names():
    spec = GroupSpec(
        "g0", "search", 2, (TrialSpec(0), TrialSpec(1)), EarlyStoppingSpec("asha", grace_period=2, max_t=8)
    )
    data = spec.to_json()
    assert data["early_stopping"]["grace_period"] == 2
    assert data["early_stopping"]["max_t"] == 8
    assert "min_budget" not in data["early_stopping"]
    assert "max_budget" not in data["early_stopping"]
    assert GroupSpec.from_json(data) == spec


def test_a_group_spec_written_by_an_earlier_sweep_is_read_without_a_warning():
    old = GroupSpec("g0", "search", 1, (TrialSpec(0),)).to_json()
    old["early_stopping"] = {
        "name": "hypersched",
        "metric": "val_acc",
        "mode": "max",
        "reduction_factor": 3.0,
        "min_budget": 3,
        "max_budget": 9,
        "options": {},
        "storage": None,
        "namespace": "sweep",
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a resumed sweep reads its own plan: nothing for the user to change
        stopping = GroupSpec.from_json(old).early_stopping
    assert (stopping.name, stopping.grace_period, stopping.max_t) == ("deadline", 3, 9)
    stopping = dataclasses.replace(stopping, options={"deadline": 600})
    callback = build_stopping_callback(stopping, max_t=stopping.max_t or 9)
    assert (type(callback).__name__, callback.grace_period, callback.max_t) == ("Deadline", 3, 9)


@pytest.mark.parametrize(("old", "new"), [("min_budget", "grace_period"), ("max_budget", "max_t")])
def test_the_old_keyword_names_work_with_a_deprecation_warning(old, new):
    with pytest.warns(DeprecationWarning, match=rf"EarlyStoppingSpec\({old}\) is renamed {new} .* pass {new}=4"):
        spec = EarlyStoppingSpec("asha", **{old: 4})
    assert getattr(spec, new) == 4
    assert old not in spec.__dict__  # not a field: group specs are written with the new names only


def test_the_old_scheduler_name_works_with_a_deprecation_warning():
    with pytest.warns(
        DeprecationWarning, match=r"EarlyStoppingSpec\(name='hypersched'\) is renamed name .* pass name='deadline'"
    ):
        spec = EarlyStoppingSpec("hypersched")
    assert spec.name == "deadline"
