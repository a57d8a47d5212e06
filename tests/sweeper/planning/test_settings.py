import dataclasses
import inspect
import re
import warnings

import pytest
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

import lightning_hydro.sweeper._impl as sweeper_impl
from hydra_plugins.lightning_hydro_sweeper.config import LightningHydroSweeperConf
from hydra_plugins.lightning_hydro_sweeper.lightning_hydro_sweeper import LightningHydroSweeper
from lightning_hydro._deprecation import removal_version
from lightning_hydro.sweeper.planning.settings import ProbeSettings, RetrainSettings, SchedulerSettings, SweepSettings


def test_defaults_and_dictconfig_input():
    s = SweepSettings.from_config(
        sampler="random",
        n_trials=8,
        fusion_limit="4",
        params=OmegaConf.create(
            {
                "model.lr": "tag(log, interval(1e-3, 1))",
                "model.depth": 2,
                "data": {"batch_size": "32,64"},
                "x": None,
            }
        ),
        scheduler=OmegaConf.create({"name": "asha", "reduction_factor": 4}),
        retrain={"top_k": 2, "overrides": ["trainer.max_epochs=50"]},
    )
    assert s.fusion_limit == 4
    assert s.params == ("model.lr=tag(log, interval(1e-3, 1))", "model.depth=2", "data.batch_size=32,64")
    assert s.scheduler.name == "asha"
    assert s.scheduler.reduction_factor == 4
    assert s.retrain.overrides == ("trainer.max_epochs=50",)
    assert SweepSettings.from_config(sampler="grid").n_trials is None


def test_the_request_ignores_ranking_and_retrain():
    a = SweepSettings.from_config(n_trials=4, metric="val_acc", mode="max", retrain={"top_k": 1})
    b = SweepSettings.from_config(n_trials=4, metric="val_loss", mode="min")
    assert a.request(["model.lr=0.1,0.2"]) == b.request(["model.lr=0.1,0.2"])
    assert a.request(["model.lr=0.1,0.2"]) != a.request(["model.lr=0.1,0.3"])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"sampler": "bayes", "n_trials": 4},
            (
                r"unknown sampler 'bayes'; expected one of \['grid', 'random', 'tpe'\]\. Fix: e\.g\. hydra\."
                r"sweeper\.sampler=random"
            ),
        ),
        (
            {"sampler": "random"},
            (
                r"sampler 'random' needs hydra.sweeper.n_trials .* got null\. Fix: e\.g\. hydra\.sweeper\."
                r"n_trials=32"
            ),
        ),
        ({"n_trials": 0}, r"hydra.sweeper.n_trials must be >= 1, got 0"),
        ({"n_trials": 4, "mode": "maximize"}, r"hydra.sweeper.mode must be 'min' or 'max', got 'maximize'"),
        ({"n_trials": 4, "round_size": 0}, r"hydra.sweeper.round_size must be >= 1 or null, got 0"),
        (
            {"n_trials": 4, "fusion_limit": 0},
            r"hydra.sweeper.fusion_limit must be >= 1 \(trials fused in one group\), got 0\. Fix",
        ),
        ({"n_trials": 4, "fusion_limit": -3}, r"fusion_limit must be >= 1 .*got -3"),
        (
            {"n_trials": 4, "fusion_limit": "many"},
            r"hydra.sweeper.fusion_limit must be an integer >= 1 or 'auto', got 'many'\. Fix",
        ),
        ({"n_trials": 4, "fusion_limit": 2.5}, r"must be an integer >= 1 or 'auto', got 2\.5"),
        (
            {"n_trials": 4, "scheduler": {"name": "median"}},
            (
                r"unknown scheduler 'median'; expected one of "
                r"\['none', 'asha', 'successive_halving', 'hyperband', 'deadline'\]\. Fix"
            ),
        ),
        (
            {"n_trials": 4, "scheduler": {"name": "asha", "reduction_factor": 1}},
            r"reduction_factor must be > 1 \(each rung keeps 1/reduction_factor of its trials\), got 1\. Fix",
        ),
        ({"n_trials": 4, "scheduler": {"reduction_factor": 0.5}}, r"reduction_factor must be > 1 .*got 0\.5"),
        ({"n_trials": 4, "scheduler": {"grace_period": 0}}, r"grace_period must be >= 1 epoch, got 0\. Fix: e\.g\."),
        (
            {"n_trials": 4, "scheduler": {"grace_period": 3, "max_t": 2}},
            r"max_t \(2\) must be >= grace_period \(3\)",
        ),
        (
            {"n_trials": 4, "scheduler": {"grace_period": 2, "min_budget": 3}},
            r"scheduler.min_budget=3 and grace_period=2 disagree; min_budget is the old name of grace_period\. Fix",
        ),
        (
            {"n_trials": 4, "probe": {"safety_margin": 1.5}},
            r"probe.safety_margin must be in \[0, 1\), got 1\.5",
        ),
        ({"n_trials": 4, "probe": {"max_limit": 0}}, r"probe.max_limit must be >= 1, got 0"),
        ({"n_trials": 4, "retrain": {"top_k": -1}}, r"retrain.top_k must be >= 0, got -1"),
        (
            {"n_trials": 4, "scheduler": "asha"},
            r"hydra.sweeper.scheduler must be a section \(key: value entries\) or null, got 'asha'\. Fix",
        ),
        ({"n_trials": 4, "retrain": 2}, r"hydra.sweeper.retrain must be a section .* got 2\. Fix"),
        (
            {"n_trials": 4, "params": ["model.lr=choice(0.1, 0.2)"]},
            r"hydra.sweeper.params must be a section .* got \['model.lr=choice\(0.1, 0.2\)'\]\. Fix",
        ),
        (
            {"n_trials": 4, "params": {"data.batch_size": [32, 64]}},
            (
                r"params.data.batch_size must be an override string .* Fix: e\.g\. 'data\.batch_size: "
                r"choice\(32, 64\)'"
            ),
        ),
    ],
)
def test_errors_name_the_setting_and_the_fix(kwargs, match):
    old_name = "min_budget" in kwargs.get("scheduler", {})  # an old name warns before the disagreement is refused
    with warnings.catch_warnings():
        warnings.simplefilter("ignore" if old_name else "error", DeprecationWarning)
        with pytest.raises(ValueError, match=match):
            SweepSettings.from_config(**kwargs)


def test_each_default_is_written_once_in_the_hydra_config_node():
    # the node Hydra composes for hydra/sweeper=lightning_hydro, as the plugin's Sweeper receives its fields
    node = OmegaConf.to_container(ConfigStore.instance().load("hydra/sweeper/lightning_hydro.yaml").node)
    assert isinstance(node, dict)
    node.pop("_target_")
    assert node == {k: v for k, v in dataclasses.asdict(LightningHydroSweeperConf()).items() if k != "_target_"}
    node["n_trials"] = 4
    # what from_config is not given takes the node's defaults: all of them given or none, the same settings
    assert SweepSettings.from_config(**node) == SweepSettings.from_config(n_trials=4)
    changed = {**node, "scheduler": {**node["scheduler"], "grace_period": 2}, "fusion_limit": 3}
    assert SweepSettings.from_config(**changed) != SweepSettings.from_config(n_trials=4)  # the comparison can fail
    # no second copy: the settings' dataclasses, from_config and the Sweeper's signature write no default
    for settings_class in (SweepSettings, SchedulerSettings, ProbeSettings, RetrainSettings):
        for f in dataclasses.fields(settings_class):
            assert f.default is dataclasses.MISSING, f"{settings_class.__name__}.{f.name}"
            assert f.default_factory is dataclasses.MISSING, f"{settings_class.__name__}.{f.name}"
    for function in (SweepSettings.from_config, LightningHydroSweeper.__init__):
        defaults = [p.name for p in inspect.signature(function).parameters.values() if p.default is not p.empty]
        assert defaults == [], function.__qualname__


def test_the_plugins_sweeper_hands_its_fields_on_unchanged(monkeypatch):
    handed = {}

    class Recorder:
        def __init__(self, **settings):
            handed.update(settings)

    monkeypatch.setattr(sweeper_impl, "LightningHydroSweeperImpl", Recorder)
    LightningHydroSweeper(sampler="grid", pad_widths=False)
    assert handed == {"sampler": "grid", "pad_widths": False}


def test_an_unknown_setting_is_refused():
    with pytest.raises(TypeError, match=r"got unexpected keyword argument\(s\) \['n_trial'\]; hydra.sweeper has"):
        SweepSettings.from_config(n_trial=4)


def test_compile_is_checked_and_reaches_the_group_specs():
    assert SweepSettings.from_config(sampler="grid", compile="reduce-overhead").compile == "reduce-overhead"
    with pytest.raises(ValueError, match=r"hydra.sweeper.compile must be false, true or reduce-overhead, got 1\."):
        SweepSettings.from_config(sampler="grid", compile=1)


def test_storage_plots_and_continuous_search():
    s = SweepSettings.from_config(sampler="tpe", n_trials=8, scheduler={"name": "asha"}, plots=False)
    assert s.continuous
    assert not s.plots
    assert s.storage is None
    assert not SweepSettings.from_config(sampler="tpe", n_trials=8).continuous  # no slot ever frees
    assert not SweepSettings.from_config(sampler="random", n_trials=8, scheduler={"name": "asha"}).continuous
    named = SweepSettings.from_config(sampler="optuna.samplers.CmaEsSampler", n_trials=8, scheduler={"name": "asha"})
    assert named.continuous
    for refilling in ("hyperband", "deadline"):  # deadline was left out when it was renamed from hypersched
        assert SweepSettings.from_config(sampler="tpe", n_trials=8, scheduler={"name": refilling}).continuous
    with pytest.warns(DeprecationWarning, match="name=hypersched is renamed deadline"):
        assert SweepSettings.from_config(sampler="tpe", n_trials=8, scheduler={"name": "hypersched"}).continuous
    assert not SweepSettings.from_config(sampler="tpe", n_trials=8, scheduler={"name": "successive_halving"}).continuous
    url = "postgresql://user@host/sweeps"
    assert SweepSettings.from_config(n_trials=4, storage=url).request([])["storage"] == url
    with pytest.raises(ValueError, match=r"storage must be a database URL .* got 'sweep\.db'"):
        SweepSettings.from_config(n_trials=4, storage="sweep.db")
    with pytest.raises(ValueError, match=r"plots must be true or false, got 'no'"):
        SweepSettings.from_config(n_trials=4, plots="no")


def test_width_padding_settings():
    settings = SweepSettings.from_config(n_trials=4)
    assert settings.pad_widths is True
    assert settings.max_padding_overhead == 1.0
    assert "pad_widths" not in settings.request([])  # the defaults keep earlier sweeps resumable
    assert SweepSettings.from_config(n_trials=4, pad_widths=False).request([])["pad_widths"] is False
    with pytest.raises(ValueError, match=r"pad_widths must be true or false, got 'yes'"):
        SweepSettings.from_config(n_trials=4, pad_widths="yes")
    with pytest.raises(ValueError, match=r"max_padding_overhead must be a number >= 0 .* got -0\.5\. Fix: e\.g\."):
        SweepSettings.from_config(n_trials=4, max_padding_overhead=-0.5)


@pytest.mark.parametrize(
    ("old", "new", "value"),
    [("min_budget", "grace_period", 2), ("max_budget", "max_t", 9), ("name", "name", "hypersched")],
)
def test_old_scheduler_names_still_work_with_a_deprecation_warning(old, new, value):
    expected_warning = rf"hydra.sweeper.scheduler.{old}.* is renamed .*removed in {re.escape(removal_version())}\.$"
    with pytest.warns(DeprecationWarning, match=expected_warning):
        settings = SweepSettings.from_config(n_trials=4, scheduler={old: value})
    expected = "deadline" if value == "hypersched" else value
    assert getattr(settings.scheduler, new) == expected
