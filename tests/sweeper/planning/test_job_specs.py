"""What each group job is told: its spec, built from the settings, the search space and the app config."""

import pytest
from omegaconf import OmegaConf

from lightning_hydro.sweeper.planning.job_specs import JobSpecs
from lightning_hydro.sweeper.planning.search_space import parse_search_space
from lightning_hydro.sweeper.planning.settings import SweepSettings
from lightning_hydro.sweeper.planning.sweep_state import SweepState
from lightning_hydro.sweeper.planning.trial_groups import TrialGroup


def job_specs(tmp_path, config, **settings):
    settings = SweepSettings.from_config(sampler="grid", **settings)
    space = parse_search_space(["model.lr=choice(0.1, 0.2)"])
    state = SweepState.open(tmp_path, settings.request(["model.lr=choice(0.1, 0.2)"]))
    return JobSpecs(
        settings,
        space,
        OmegaConf.create(config),
        state,
        rung_storage="sqlite:///rungs.db",
        rung_namespace="sweep",
        channel=None,
    )


def probe_group() -> TrialGroup:
    return TrialGroup("probe_0000", "probe", (0,), 1, ())


def test_the_fused_section_of_the_app_config_reaches_the_spec_with_the_sweeps_compile(tmp_path):
    specs = job_specs(tmp_path, {"fused": {"backend": "vmap"}, "model": {"lr": 0.1}}, compile=True)
    spec = specs.spec(probe_group(), {0: ["model.lr=0.1"]}, trials=[])
    assert spec.fused == {"backend": "vmap", "compile": True}


def test_a_value_where_the_fused_section_belongs_is_refused_before_any_job(tmp_path):
    specs = job_specs(tmp_path, {"fused": True, "model": {"lr": 0.1}})
    with pytest.raises(ValueError, match=r"^lightning_hydro sweeper: the config's 'fused' must be a section .* True"):
        specs.spec(probe_group(), {0: ["model.lr=0.1"]}, trials=[])
