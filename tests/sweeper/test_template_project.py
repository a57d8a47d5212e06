"""A lightning-hydra-template-shaped project sweeps with lightning_hydro after adding one hparams_search file.

Its ``src/train.py``, utils, module and configs stay as they are: each group job runs them, the job's ``model`` node
builds the group's fused trials, and ``train.py`` reads ``cfg.optimized_metric`` back from
``trainer.callback_metrics`` (``get_metric_value``, which raises ``Metric value not found!`` for a missing name)
and returns it: in a fused group, the value of the group's best trial by the sweep's metric and mode.
"""

from __future__ import annotations

import csv
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from .template_project import (
    FEW_BATCHES,
    best_of,
    make_project,
    read_json,
    retrieved_values,
    run_train,
    train_command,
)

# Each test's one change to the project is the added hparams_search file; the command line only picks it,
# the template's CSV logger, a few batches per epoch, and a sweep directory the test can find.
SEARCH = ["-m", "hparams_search=mnist_lightning_hydro", "logger=csv", "extras.print_config=false", *FEW_BATCHES]
SMALL = ["hydra.sweeper.n_trials=4", "trainer.max_epochs=1"]
METRIC, MODE = "val/acc", "max"  # the search file's hydra.sweeper.metric and mode


def search_groups(sweep_dir: Path) -> list[dict[str, Any]]:
    plan = read_json(sweep_dir / "lightning_hydro" / "plan.json")
    return [g for g in plan["groups"] if g["kind"] == "search"]


def assert_each_job_returned_its_best_trials_value(sweep_dir: Path, name: str) -> None:
    """Each group job's train.py returned ``name`` of its group's best trial by the sweep's metric (not by ``name``)."""
    trials = read_json(sweep_dir / "results.json")["trials"]
    for group in search_groups(sweep_dir):
        members = [t for t in trials if t["group"] == group["group_id"]]
        best = best_of(members, METRIC, MODE)
        assert retrieved_values(sweep_dir / group["group_id"]) == {name: best["metrics"][name]}, group["group_id"]


def last_csv_values(job_dir: Path, column: str) -> float:
    with open(next((job_dir / "csv").glob("version_*/metrics.csv"))) as f:
        values = [row[column] for row in csv.DictReader(f) if row.get(column)]
    return float(values[-1])


def test_the_unchanged_template_sweeps_to_the_end_reading_the_optimized_metric_back(tmp_path):
    # the run: random + ASHA, 8 trials, test=false, 2 epochs, optimized_metric val/acc_best
    project = make_project(tmp_path)
    sweep_dir = tmp_path / "sweep"
    out = run_train(project, [*SEARCH, "test=false", "trainer.max_epochs=2", f"hydra.sweep.dir={sweep_dir}"])
    assert out.returncode == 0, out.stdout[-6000:]
    assert "Metric value not found" not in out.stdout

    results = read_json(sweep_dir / "results.json")
    trials = results["trials"]
    assert sorted(t["trial_id"] for t in trials) == list(range(8))
    assert any(t["status"] == "stopped" for t in trials)  # ASHA stopped some at its first rung
    assert max(len(g["trial_ids"]) for g in search_groups(sweep_dir)) > 1  # fused
    assert_each_job_returned_its_best_trials_value(sweep_dir, "val/acc_best")
    # results.json keeps every trial's own values: those its CSV columns logged, not the group's best
    for trial in trials:
        for name in ("val/acc", "val/acc_best"):
            logged = last_csv_values(sweep_dir / trial["group"], f"{name}/trial_{trial['trial_id']}")
            assert trial["metrics"][name] == pytest.approx(logged, abs=1e-6)
    assert len({t["metrics"]["val/acc"] for t in trials}) > 1


def test_the_template_project_sweeps_fused_with_its_own_train_py(tmp_path):
    project = make_project(tmp_path)
    sweep_dir = tmp_path / "sweep"
    # test=true (the template's default): train.py tests the best checkpoint, then reads test/acc back
    args = [*SEARCH, *SMALL, "optimized_metric=test/acc", f"hydra.sweep.dir={sweep_dir}"]
    out = run_train(project, args)
    assert out.returncode == 0, out.stdout[-6000:]

    results = read_json(sweep_dir / "results.json")
    trials = results["trials"]
    assert [t["trial_id"] for t in trials] == [0, 1, 2, 3]
    groups = search_groups(sweep_dir)
    assert max(len(g["trial_ids"]) for g in groups) > 1  # trials share a job: they were fused
    for trial in trials:
        assert trial["status"] == "completed"
        assert trial["budget"] == 1
        assert trial["backend"] in ("vmap", "hfta", "loop")  # what the group ran on: the user's own task function
        # the module's own metrics, per trial; test/acc from the template's trainer.test after fit
        assert {"val/acc", "val/acc_best", "train/loss", "test/acc"} <= set(trial["metrics"])
        assert isinstance(trial["seed"], int)  # seed: null in the template: each trial gets one, recorded
    seeds = {t["seed"] for t in trials}
    assert len(seeds) == len(trials)
    # the test value of the group's best trial by validation accuracy: never a choice by test values
    assert_each_job_returned_its_best_trials_value(sweep_dir, "test/acc")
    with open(sweep_dir / "results.csv") as f:
        assert {row["backend"] for row in csv.DictReader(f)} <= {"vmap", "hfta", "loop"}
    for group in groups:
        job_dir = sweep_dir / group["group_id"]
        batch_sizes = {trials[t]["params"]["data.batch_size"] for t in group["trial_ids"]}
        assert len(batch_sizes) == 1  # non-fusible: one value per group
        # the user's CSV logger (configs/logger/csv.yaml) logged every trial of the group under its own name,
        # and log_hyperparameters' parameter counts
        with open(next((job_dir / "csv").glob("version_*/metrics.csv"))) as f:
            columns = next(csv.reader(f))
        assert "model/params/total" in next((job_dir / "csv").glob("version_*/hparams.yaml")).read_text()
        for tid in group["trial_ids"]:
            assert f"val/acc/trial_{tid}" in columns
            assert f"test/acc/trial_{tid}" in columns
            # the user's ModelCheckpoint (configs/callbacks/default.yaml, monitor val/acc) kept each trial's own
            assert (job_dir / "checkpoints" / f"trial_{tid}" / "epoch_000.ckpt").is_file()
        # the job's saved config is the user's, not the rewritten node
        assert "src.models.mnist_module.MNISTLitModule" in (job_dir / ".hydra" / "config.yaml").read_text()
        assert "Tested the checkpoint" in (job_dir / "train.log").read_text()
    assert "nothing fuses" not in out.stdout


@pytest.mark.slow
def test_the_template_project_runs_unfused_as_the_template_does(tmp_path):
    # the fixture itself: one model, fit and test with the best checkpoint, the metric read back
    project = make_project(tmp_path, add_search=False)
    run_dir = tmp_path / "run"
    args = ["trainer.max_epochs=1", *FEW_BATCHES, "+optimized_metric=test/acc", f"hydra.run.dir={run_dir}"]
    out = run_train(project, args)
    assert out.returncode == 0, out.stdout[-6000:]
    assert set(retrieved_values(run_dir)) == {"test/acc"}
    assert (run_dir / "config_tree.log").is_file()  # extras printed the config with rich
    assert "Tested the checkpoint" in (run_dir / "train.log").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["random", "tpe"])
@pytest.mark.parametrize("test", [True, False])
def test_longer_template_sweeps_with_asha_read_the_optimized_metric_back(tmp_path, sampler, test):
    project = make_project(tmp_path)
    sweep_dir = tmp_path / "sweep"
    name = "test/acc" if test else "val/acc_best"
    args = [
        *SEARCH,
        f"hydra.sweeper.sampler={sampler}",
        "hydra.sweeper.n_trials=6",
        "hydra.sweeper.round_size=2",
        "trainer.max_epochs=3",
        "hydra.sweeper.plots=false",
        f"test={test}",
        f"optimized_metric={name}",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    out = run_train(project, args)
    assert out.returncode == 0, out.stdout[-6000:]
    trials = read_json(sweep_dir / "results.json")["trials"]
    assert sorted(t["trial_id"] for t in trials) == list(range(6))
    assert all(isinstance(t["seed"], int) for t in trials)
    assert any(t["status"] == "stopped" for t in trials)
    # the template's trainer.test(ckpt_path=best) after fit tests every trial, those ASHA ended included
    assert all(("test/acc" in t["metrics"]) == test for t in trials)
    assert_each_job_returned_its_best_trials_value(sweep_dir, name)
    if sampler == "tpe":
        asked = [
            tid
            for g in search_groups(sweep_dir)
            if (sweep_dir / g["group_id"] / "asked_trials.json").is_file()
            for tid, _ in read_json(sweep_dir / g["group_id"] / "asked_trials.json")["asked"]
        ]
        assert len(asked) == 4  # the sweeper asked 2 (round_size); the user's train.py, through the group, the rest


@pytest.mark.slow
def test_a_killed_template_sweep_resumes_without_retraining_finished_groups(tmp_path):
    project = make_project(tmp_path)
    sweep_dir = tmp_path / "sweep"
    # 30 batches an epoch (not 3): between a group's first last.ckpt and its result lie 2 epochs, long enough to be
    # seen by polling every 0.2 s (with 3 batches the whole sweep ended in 7 s, before it could be killed)
    args = [*SEARCH, "++trainer.limit_train_batches=30", "hydra.sweeper.n_trials=6", "trainer.max_epochs=3"]
    args.append(f"hydra.sweep.dir={sweep_dir}")
    command, env = train_command(project, args)
    proc = subprocess.Popen(command, cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def interrupted_with_a_checkpoint() -> list[str]:
        """Groups with a fused last.ckpt (the user's ModelCheckpoint, save_last) and no result yet."""
        return [
            p.parent.parent.name
            for p in sweep_dir.glob("group_*/checkpoints/last.ckpt")
            if not (p.parent.parent / "group_result.json").exists()
        ]

    deadline = time.monotonic() + 500
    while time.monotonic() < deadline and proc.poll() is None:
        if list(sweep_dir.glob("group_*/group_result.json")) and interrupted_with_a_checkpoint():
            break
        time.sleep(0.2)
    assert proc.poll() is None, "the sweep ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = {p.parent.name: p.read_text() for p in sweep_dir.glob("group_*/group_result.json")}
    interrupted = interrupted_with_a_checkpoint()
    assert done
    assert interrupted

    out = run_train(project, args)
    assert out.returncode == 0, out.stdout[-6000:]
    # the interrupted group went on from its fused checkpoint (the template's ckpt_path), not from scratch
    assert f"group resumes from {sweep_dir / interrupted[0] / 'checkpoints' / 'last.ckpt'}" in out.stdout
    for group_id, text in done.items():  # finished groups were kept, not retrained
        assert (sweep_dir / group_id / "group_result.json").read_text() == text
    trials = read_json(sweep_dir / "results.json")["trials"]
    assert len(trials) == 6
    assert all(t["status"] in ("completed", "stopped") and 1 <= t["budget"] <= 3 for t in trials)
    # the resumed job, too, returned its group's best trial, those that ended before the kill included
    assert_each_job_returned_its_best_trials_value(sweep_dir, "val/acc_best")
