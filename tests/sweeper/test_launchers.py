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


SWEEP_WIDE = [
    *TINY,
    "trainer.max_epochs=3",
    "hydra.sweeper.sampler=tpe",
    "hydra.sweeper.n_trials=12",
    "hydra.sweeper.fusion_limit=3",
    "hydra.sweeper.scheduler.name=asha",
    "hydra.sweeper.plots=false",
    "data.batch_size=choice(32, 64)",
]


def check_one_search(sweep_dir, n_trials):
    """Every group job asked the sweep's one sampler and recorded into the sweep's one rung store."""
    import optuna

    from lightning_hydro.stopping import SqliteRungStore
    from lightning_hydro.sweeper.planning.study_channel import STUDY_NAME

    trials = read_results(sweep_dir)["trials"]
    assert sorted(t["trial_id"] for t in trials) == list(range(n_trials))  # unique sweep-wide, n_trials of them
    assert {t["status"] for t in trials} <= {"completed", "stopped"}
    state = sweep_dir / "lightning_hydro"
    records = SqliteRungStore(state / "rungs.db", namespace="sweep").records(milestone=1)
    assert sorted(r.trial_id for r in records) == sorted(f"sweep/{t['trial_id']}" for t in trials)
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(state / "sampler.journal")))
    study = optuna.load_study(study_name=STUDY_NAME, storage=storage)
    assert sorted(t.number for t in study.get_trials()) == list(range(n_trials))
    assert all(t.state.is_finished() and 1 in t.intermediate_values for t in study.get_trials())


@pytest.mark.slow
def test_joblib_workers_share_the_sweeps_rung_store_and_sampler(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    run_sweep(tmp_path, [*SWEEP_WIDE, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"])
    groups = [g for g in json.loads((tmp_path / "lightning_hydro" / "plan.json").read_text())["groups"]]
    pids = {json.loads((tmp_path / g["group_id"] / "group_result.json").read_text())["pid"] for g in groups}
    assert len(pids | {os.getpid()}) == len(groups) + 1  # each group in a worker process of its own
    check_one_search(tmp_path, 12)


@pytest.mark.slow
def test_ray_launcher_jobs_share_the_sweeps_rung_store_and_sampler(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    # The launcher starts a local Ray cluster (ray.init without an address) and runs each group as a Ray task.
    run(
        [
            "-m",
            *SWEEP_WIDE,
            f"hydra.sweep.dir={tmp_path}",
            "hydra/launcher=ray",
            "+hydra.launcher.ray.init.num_cpus=2",
            "+hydra.launcher.ray.init.include_dashboard=false",
        ],
        900,
    )
    check_one_search(tmp_path, 12)


def test_joblib_jobs_on_a_gpu_node_get_one_gpu_each_never_two_at_once(tmp_path, monkeypatch, caplog):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    import torch

    if torch.cuda.is_available():
        pytest.skip("fakes a 2-GPU node on a machine without GPUs (the jobs train on the CPU)")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # what the sweeper deals GPUs by
    args = [a for a in TWO_GROUPS if a not in ("-m", "model.lr=0.1,0.2", "data.batch_size=32,64")]
    args += ["data.batch_size=16,32,64,128", "trainer.accelerator=auto", "trainer.devices=auto"]  # devices: all GPUs
    with caplog.at_level("INFO"):
        run_sweep(tmp_path, [*args, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"])
    assert "2 GPU(s) in 2 block(s) of 1, at most 1 group job(s) per block at a time" in caplog.text
    results = {g: json.loads((tmp_path / g / "group_result.json").read_text()) for g in GROUPS_OF_FOUR}
    # the first job alone, then launches of two (one per GPU): never two jobs on one GPU at once
    assert {g: r["devices"] for g, r in results.items()} == {
        "group_0000": "0",
        "group_0001": "0",
        "group_0002": "1",
        "group_0003": "0",
    }
    assert all(t["status"] == "completed" for t in read_results(tmp_path)["trials"])


GROUPS_OF_FOUR = ("group_0000", "group_0001", "group_0002", "group_0003")
