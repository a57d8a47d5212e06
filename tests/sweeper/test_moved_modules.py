"""The sweeper's old module paths (before planning/ and job/) keep working for one release, with a warning."""

import importlib
import warnings

import pytest
from hydra.utils import get_method

import lightning_hydro.sweeper as sweeper

PLANNING = [
    "device_plan",
    "fusion_limit",
    "fusion_report",
    "launch_rules",
    "plots",
    "reports",
    "samplers",
    "search_space",
    "settings",
    "study_channel",
    "sweep_search",
    "sweep_state",
    "trial_groups",
    "width_groups",
]
JOB = [
    "backend_cache",
    "early_stopping",
    "fit_from_config",
    "fit_trials",
    "group_model",
    "group_search",
    "group_task",
    "metric_history",
    "overrides",
    "rank_relaunch",
    "scaling_settings",
    "sweep_group_module",
    "trainer_factory",
]
MOVED = {
    **{f"lightning_hydro.sweeper.{name}": f"lightning_hydro.sweeper.planning.{name}" for name in PLANNING},
    **{f"lightning_hydro.sweeper.{name}": f"lightning_hydro.sweeper.job.{name}" for name in JOB},
    "lightning_hydro.sweeper.width_partitions": "lightning_hydro.sweeper.planning.grouping",
    "lightning_hydro.fused.memory_probe": "lightning_hydro.sweeper.planning.memory_probe",
}


# names the new modules gained after the move (they never lived at the old path)
NAMES_ADDED_SINCE = {
    "lightning_hydro.sweeper.planning.grouping": {"GroupPlanner", "padded_in"},
    "lightning_hydro.sweeper.planning.launch_rules": {"gpus_matter", "plan_sweep_devices"},
}


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_module_path_resolves_every_public_name_with_a_warning(old, new):
    old_module, new_module = importlib.import_module(old), importlib.import_module(new)
    # every name the module had when it moved (its public names then, imported ones included)
    moved = old_module._NAMES
    assert set(moved) >= set(new_module.__all__) - NAMES_ADDED_SINCE.get(new, set()), new
    for name in moved:
        with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} moved to {new}\.{name}; import it from there"):
            assert getattr(old_module, name) is getattr(new_module, name)
    with pytest.raises(AttributeError, match=r"has no attribute 'no_such_name'"):
        old_module.__getattr__("no_such_name")


@pytest.mark.parametrize(
    ("old", "name", "home"),
    [
        # imported by the new modules when they moved, no longer at their top (they load torch or Lightning)
        ("lightning_hydro.sweeper.width_partitions", "WidthPaddingError", "lightning_hydro.stacking.width_plan"),
        ("lightning_hydro.sweeper.group_task", "MonitorNotLoggedError", "lightning_hydro.callbacks.callback_arguments"),
        ("lightning_hydro.sweeper.group_task", "built_groups", "lightning_hydro.sweeper.job.group_model"),
        ("lightning_hydro.sweeper.group_task", "describe_trials", "lightning_hydro.sweeper.job.group_model"),
        ("lightning_hydro.sweeper.group_task", "rewrite_model_node", "lightning_hydro.sweeper.job.group_model"),
    ],
)
def test_an_old_path_resolves_a_name_it_imported_to_where_it_is_defined(old, name, home):
    with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} moved to {home}\.{name}; import it from there"):
        value = getattr(importlib.import_module(old), name)
    assert value is getattr(importlib.import_module(home), name)


def test_from_import_through_an_old_path_warns():
    with pytest.warns(DeprecationWarning, match=r"sweeper\.trial_groups\.TrialGroup moved to .*planning\.trial_groups"):
        from lightning_hydro.sweeper.trial_groups import TrialGroup
    from lightning_hydro.sweeper.planning.trial_groups import TrialGroup as moved

    assert TrialGroup is moved


def test_the_package_functions_are_not_hidden_by_the_old_modules_of_the_same_name():
    importlib.import_module("lightning_hydro.sweeper.fit_from_config")
    importlib.import_module("lightning_hydro.sweeper.fit_trials")
    from lightning_hydro.sweeper.job.fit_from_config import fit_from_config
    from lightning_hydro.sweeper.job.fit_trials import fit_trials

    assert sweeper.fit_from_config is fit_from_config
    assert sweeper.fit_trials is fit_trials


def test_an_old_model_target_in_a_saved_job_config_still_builds_the_group():
    from lightning_hydro.sweeper.job.group_model import GROUP_MODEL_TARGET, fused_group_model

    assert GROUP_MODEL_TARGET == "lightning_hydro.sweeper.job.group_model.fused_group_model"
    with pytest.warns(DeprecationWarning, match=r"group_model\.fused_group_model moved to .*job\.group_model"):
        assert get_method("lightning_hydro.sweeper.group_model.fused_group_model") is fused_group_model


def test_the_samplers_old_trial_outcome_still_resolves_through_the_old_path():
    from lightning_hydro.sweeper.planning.samplers import SamplerFeedback

    old = importlib.import_module("lightning_hydro.sweeper.samplers")
    with pytest.warns(DeprecationWarning, match=r"TrialOutcome is renamed SamplerFeedback .*planning\.samplers"):
        assert old.TrialOutcome is SamplerFeedback


def test_the_new_paths_load_without_deprecation_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for new in MOVED.values():
            importlib.import_module(new)


@pytest.mark.parametrize(
    ("old", "name"),
    [
        ("lightning_hydro.sweeper.job.group_model", "trial_seed"),
        ("lightning_hydro.sweeper.group_model", "trial_seed"),
        ("lightning_hydro.sweeper.group_task", "ERROR_FILE"),
        ("lightning_hydro.sweeper.trial_groups", "GroupKind"),
    ],
)
def test_the_contracts_names_resolve_from_the_modules_they_left(old, name):
    group_spec = importlib.import_module("lightning_hydro.sweeper.group_spec")
    with pytest.warns(DeprecationWarning, match=rf"{old}\.{name} moved to .*sweeper\.group_spec\.{name}"):
        assert getattr(importlib.import_module(old), name) is getattr(group_spec, name)
