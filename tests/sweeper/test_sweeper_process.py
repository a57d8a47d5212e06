"""The sweeper's own process loads neither torch nor Lightning: Hydra's ``-m`` start and the planning stay light.

What a job needs (the group's model, the Trainer, the memory probe of ``fusion_limit: auto``) is imported in the job.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_hydro.sweeper.planning import launch_rules

from .conftest import REPO

HEAVY = ("torch", "lightning", "torchmetrics")
APP = Path(__file__).parent / "torchless_app"  # a Hydra app whose launcher answers the jobs from their specs
PLANNING = REPO / "lightning_hydro" / "sweeper" / "planning"
# The one planning module that needs torch: the probe that builds the group to measure it, run in a probe job.
JOB_ONLY = {"memory_probe"}


def loaded_after(code: str) -> list[str]:
    """Which of torch, Lightning and torchmetrics a fresh interpreter has loaded after running ``code``."""
    probe = f"{code}\nimport sys\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1].replace("'", '"'))


def test_hydra_loads_the_sweeper_without_torch_or_lightning():
    # As Hydra does for `-m` with hydra/sweeper=lightning_hydro: the shim (discovery), then the instance, whose
    # __init__ imports lightning_hydro.sweeper._impl.
    code = (
        "from hydra_plugins.lightning_hydro_sweeper.lightning_hydro_sweeper import LightningHydroSweeper\n"
        "sweeper = LightningHydroSweeper()\n"
        "assert type(sweeper.sweeper).__module__ == 'lightning_hydro.sweeper._impl'"
    )
    assert loaded_after(code) == []


def test_every_planning_module_but_the_probe_imports_without_torch():
    modules = sorted(p.stem for p in PLANNING.glob("*.py") if p.stem != "__init__" and p.stem not in JOB_ONLY)
    assert "grouping" in modules
    code = "\n".join(f"import lightning_hydro.sweeper.planning.{name}" for name in modules)
    assert loaded_after(code) == []


def test_the_sweeper_package_resolves_its_names_lazily():
    code = "import lightning_hydro.sweeper as sweeper\nassert 'fit_from_config' in dir(sweeper)"
    assert loaded_after(code) == []
    assert {"lightning", "torch"} <= set(loaded_after("from lightning_hydro.sweeper import fit_from_config"))
    import lightning_hydro.sweeper as sweeper

    assert sorted(sweeper.__all__) == sorted(sweeper._EXPORTS)
    for name in sweeper.__all__:
        assert getattr(sweeper, name) is getattr(importlib.import_module(sweeper._EXPORTS[name]), name)


SWEEPS = {  # name: (trials, overrides)
    "random_partitions_retrain": (
        6,
        [
            "hydra.sweeper.n_trials=6",
            "model.lr=interval(0.01, 0.1)",
            "data.batch_size=choice(16, 32)",
            "hydra.sweeper.non_fusible=[data.batch_size]",
            "hydra.sweeper.retrain.top_k=1",
        ],
    ),
    "grid_padded_widths_probed_limit": (
        6,
        [
            "hydra.sweeper.sampler=grid",
            "model.lr=choice(0.1, 0.01)",
            "model.hidden_dim=choice(8, 16, 32)",
            "hydra.sweeper.non_fusible=[model.hidden_dim]",
            "hydra.sweeper.fusion_limit=auto",
        ],
    ),
    "tpe_asha": (
        4,
        [
            "hydra.sweeper.sampler=tpe",
            "hydra.sweeper.n_trials=4",
            "model.lr=interval(0.01, 0.1)",
            "hydra.sweeper.scheduler.name=asha",
        ],
    ),
}


@pytest.mark.parametrize("name", sorted(SWEEPS))
def test_a_whole_sweep_is_planned_launched_and_reported_without_torch_or_lightning(tmp_path, name):
    if "tpe" in name:
        pytest.importorskip("optuna")
    trials, overrides = SWEEPS[name]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(APP)])}
    result = subprocess.run(
        [sys.executable, "app.py", "-m", f"hydra.sweep.dir={tmp_path}", *overrides],
        cwd=APP,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    assert len(results["trials"]) == trials
    assert all(t["status"] == "completed" for t in results["trials"])
    plan = json.loads((tmp_path / "lightning_hydro" / "plan.json").read_text())
    if "retrain" in name:
        assert len(results["retrain"]) == 1
    if "probed" in name:  # the probe job's answer capped the groups
        assert list(plan["fusion_limits"].values()) == [3]
        assert [len(g["trial_ids"]) for g in plan["groups"]] == [3, 3]
    loaded = next(line for line in result.stdout.splitlines() if line.startswith("LOADED "))
    assert json.loads(loaded.removeprefix("LOADED ")) == []


def test_the_default_sweep_does_not_count_gpus(monkeypatch):
    # Counting them loads torch; with the basic launcher and no devices_per_group they change nothing.
    def no_count() -> list[str]:
        raise AssertionError("visible_gpus() was called")

    monkeypatch.setattr(launch_rules, "visible_gpus", no_count)
    config = launcher_config("hydra._internal.core_plugins.basic_launcher.BasicLauncher", {"accelerator": "auto"})
    assert launch_rules.plan_sweep_devices(config, devices_per_group=None, groups_per_device=1) is None


def launcher_config(target: str, trainer: dict[str, object], **launcher: object):
    from omegaconf import OmegaConf

    return OmegaConf.create({"hydra": {"launcher": {"_target_": target, **launcher}}, "trainer": trainer})


TARGETS = {
    "basic": "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
    "joblib": "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
    "submitit_local": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
    "submitit_slurm": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher",
    "ray": "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher",
    "other": "my_launchers.Cloud",
}
TRAINERS = [
    {"accelerator": accelerator, "devices": devices, "strategy": strategy}
    for accelerator in ("auto", "gpu", "cpu", "mps")
    for devices in ("auto", -1, 1, 2, [0, 1])
    for strategy in ("auto", "ddp", "ddp_spawn")
]


def outcome(config, devices_per_group, gpus, *, count_always, monkeypatch):
    """What plan_sweep_devices decides on a machine with ``gpus`` GPUs: the plan, or the refusal's text."""
    monkeypatch.setattr(launch_rules, "visible_gpus", lambda: list(gpus))
    if count_always:
        monkeypatch.setattr(launch_rules, "gpus_matter", lambda *args, **kwargs: True)
    try:
        return launch_rules.plan_sweep_devices(config, devices_per_group=devices_per_group, groups_per_device=2)
    except ValueError as err:
        return str(err)
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("kind", sorted(TARGETS))
def test_not_counting_gpus_where_they_do_not_matter_changes_no_plan_and_no_refusal(kind, monkeypatch):
    skipped = 0
    for trainer in TRAINERS:
        for devices_per_group in (None, 1, 2):
            for tasks_per_node in (None, 2):
                config = launcher_config(TARGETS[kind], trainer, tasks_per_node=tasks_per_node)
                for gpus in ([], ["0"], [str(i) for i in range(8)]):
                    counted = outcome(config, devices_per_group, gpus, count_always=True, monkeypatch=monkeypatch)
                    planned = outcome(config, devices_per_group, gpus, count_always=False, monkeypatch=monkeypatch)
                    assert planned == counted, (kind, trainer, devices_per_group, tasks_per_node, gpus)
                placement = launch_rules.TrainerPlacement.from_config(trainer)
                skipped += not launch_rules.gpus_matter(kind, placement, devices_per_group=devices_per_group)
    assert skipped > 0  # the comparison covered cases where the count is skipped
