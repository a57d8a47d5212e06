"""Groups as jobs of other launchers: joblib (parallel processes) and submitit's local mode (slow)."""

import json
import os

import pytest

from .conftest import TINY, read_results, run_sweep, train_subprocess

TWO_GROUPS = [
    "-m",
    *TINY,
    "hydra.sweeper.sampler=grid",
    "hydra.sweeper.params=null",
    "model.lr=0.1,0.2",
    "data.batch_size=32,64",
]


def run(args, timeout):
    proc = train_subprocess(args)
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-3000:]
    return out


def test_joblib_runs_two_groups_in_parallel_processes(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    # The sweeper runs here; joblib's two worker processes train one group each.
    args = [a for a in TWO_GROUPS if a not in ("-m", "model.lr=0.1,0.2")]
    run_sweep(tmp_path, [*args, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"])
    results = [json.loads((tmp_path / g / "group_result.json").read_text()) for g in ("group_0000", "group_0001")]
    assert len({r["pid"] for r in results} | {os.getpid()}) == 3
    trials = read_results(tmp_path)["trials"]
    assert sorted(t["trial_id"] for t in trials) == [0, 1]
    assert all(t["status"] == "completed" for t in trials)


@pytest.mark.slow
def test_submitit_local_smoke(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    run(
        [
            *TWO_GROUPS,
            f"hydra.sweep.dir={tmp_path}",
            "hydra/launcher=submitit_local",
            "hydra.launcher.timeout_min=10",
        ],
        600,
    )
    trials = read_results(tmp_path)["trials"]
    assert sorted(t["trial_id"] for t in trials) == [0, 1, 2, 3]
    assert all(t["status"] == "completed" for t in trials)
    assert (tmp_path / ".submitit").is_dir()
