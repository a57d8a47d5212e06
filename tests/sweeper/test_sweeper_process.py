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
