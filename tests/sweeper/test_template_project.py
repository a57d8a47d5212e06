"""A lightning-hydra-template-shaped project sweeps with lightning_hydro after adding one hparams_search file.

Its ``src/train.py`` and module stay as they are: each group job runs them, and the job's ``model`` node
builds the group's fused trials.
"""

from __future__ import annotations

import csv
import signal
import subprocess
import time

import pytest

from .template_project import make_project, read_json, run_train, train_command

# Each test's one change to the project is the added hparams_search file; the command line only picks it,
# the template's CSV logger, and a sweep directory the test can find.
SEARCH = ["-m", "hparams_search=mnist_lightning_hydro", "logger=csv", "extras.print_config=false"]
SMALL = ["hydra.sweeper.n_trials=4", "trainer.max_epochs=1"]


def test_the_template_project_sweeps_fused_with_its_own_train_py(tmp_path):
    project = make_project(tmp_path)
    sweep_dir = tmp_path / "sweep"
    out = run_train(project, [*SEARCH, *SMALL, f"hydra.sweep.dir={sweep_dir}"])
    assert out.returncode == 0, out.stdout[-6000:]

    results = read_json(sweep_dir / "results.json")
    trials = results["trials"]
    assert [t["trial_id"] for t in trials] == [0, 1, 2, 3]
    plan = read_json(sweep_dir / "lightning_hydro" / "plan.json")
    groups = [g for g in plan["groups"] if g["kind"] == "search"]
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
    with open(sweep_dir / "results.csv") as f:
        assert {row["backend"] for row in csv.DictReader(f)} <= {"vmap", "hfta", "loop"}
    for group in groups:
        job_dir = sweep_dir / group["group_id"]
        batch_sizes = {trials[t]["params"]["data.batch_size"] for t in group["trial_ids"]}
        assert len(batch_sizes) == 1  # non-fusible: one value per group
        # the user's CSV logger (configs/logger/csv.yaml) logged every trial of the group under its own name
        with open(next((job_dir / "csv").glob("version_*/metrics.csv"))) as f:
            columns = next(csv.reader(f))
        for tid in group["trial_ids"]:
            assert f"val/acc/trial_{tid}" in columns
            assert f"test/acc/trial_{tid}" in columns
            # the user's ModelCheckpoint (configs/callbacks/default.yaml, monitor val/acc) kept each trial's own
            assert (job_dir / "checkpoints" / f"trial_{tid}" / "epoch_000.ckpt").is_file()
        # the job's saved config is the user's, not the rewritten node
        assert "src.models.mnist_module.MNISTLitModule" in (job_dir / ".hydra" / "config.yaml").read_text()
    assert "nothing fuses" not in out.stdout


@pytest.mark.slow
def test_the_template_projects_own_train_py_asks_the_sweeps_sampler_for_freed_slots(tmp_path):
    project = make_project(tmp_path)
    sweep_dir = tmp_path / "sweep"
    continuous = [
        "hydra.sweeper.sampler=tpe",
        "hydra.sweeper.n_trials=6",
        "hydra.sweeper.round_size=2",
        "hydra.sweeper.scheduler.name=asha",
        "trainer.max_epochs=3",
        "hydra.sweeper.plots=false",
    ]
    out = run_train(project, [*SEARCH, *continuous, f"hydra.sweep.dir={sweep_dir}"])
    assert out.returncode == 0, out.stdout[-6000:]
    trials = read_json(sweep_dir / "results.json")["trials"]
    assert sorted(t["trial_id"] for t in trials) == list(range(6))
    assert all(isinstance(t["seed"], int) for t in trials)
    # the template's trainer.test(ckpt_path=best) after fit tests every trial, those ASHA ended included
    assert all("test/acc" in t["metrics"] for t in trials)
    plan = read_json(sweep_dir / "lightning_hydro" / "plan.json")
    asked = [
        tid
        for g in plan["groups"]
        if (sweep_dir / g["group_id"] / "asked_trials.json").is_file()
        for tid, _ in read_json(sweep_dir / g["group_id"] / "asked_trials.json")["asked"]
    ]
    assert len(asked) == 4  # the sweeper asked 2 (round_size); the user's train.py, through the group, the rest


@pytest.mark.slow
def test_a_killed_template_sweep_resumes_without_retraining_finished_groups(tmp_path):
    project = make_project(tmp_path)
    sweep_dir = tmp_path / "sweep"
    args = [*SEARCH, "hydra.sweeper.n_trials=6", "trainer.max_epochs=3", f"hydra.sweep.dir={sweep_dir}"]
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
    assert all(t["status"] == "completed" and t["budget"] == 3 for t in trials)
