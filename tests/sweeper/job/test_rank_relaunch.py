"""A sweep whose Trainer uses DDP runs one sweep: the re-launched rank runs its group's job, nothing else.

The real sweeps (``examples/train.py -m ... +trainer.strategy=ddp trainer.devices=2``, two CPU processes over gloo)
are slow; what a re-launched rank finds, and the refusals at launch, are checked without them.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch.distributed as dist

from lightning_hydro.sweeper.group_spec import GROUP_ENV, GroupSpec, TrialSpec, spec_path
from lightning_hydro.sweeper.job.rank_relaunch import SWEEP_DIR_ENV, job_scope, relaunched_job
from lightning_hydro.sweeper.json_files import write_json_atomic

from ..conftest import TINY, read_results, run_sweep, train_subprocess

TWO_GROUPS = [
    *TINY,
    "hydra.sweeper.sampler=grid",
    "hydra.sweeper.params=null",
    "model.lr=0.3,0.01",
    "data.batch_size=32,64",
]


def test_the_sweeps_own_process_and_rank_zero_run_the_sweep():
    assert relaunched_job({}) is None
    assert relaunched_job({"LOCAL_RANK": "0", GROUP_ENV: "group_0000"}) is None


def test_a_further_rank_runs_the_job_its_group_was_launched_with(tmp_path):
    sweep_dir = tmp_path / "it's a sweep"
    launch = ("model.lr=0.3", "hydra.sweep.subdir=group_0001", f"++hydra.job.env_set.{GROUP_ENV}=group_0001")
    spec = GroupSpec("group_0001", "search", 2, (TrialSpec(0), TrialSpec(1)), launch=launch)
    spec_path(sweep_dir, "group_0001").parent.mkdir(parents=True)
    write_json_atomic(spec_path(sweep_dir, "group_0001"), spec.to_json())
    job = relaunched_job({"LOCAL_RANK": "1", GROUP_ENV: "group_0001", SWEEP_DIR_ENV: str(sweep_dir)})
    assert job is not None
    assert job.group_id == "group_0001"
    assert job.overrides == [*launch, f"hydra.sweep.dir='{str(sweep_dir)[: -len(sweep_dir.name)]}it\\'s a sweep'"]


def test_a_further_rank_of_a_whole_sweep_is_refused():
    with pytest.raises(RuntimeError, match=r"LOCAL_RANK=1 but no sweep group to run.*torchrun"):
        relaunched_job({"LOCAL_RANK": "1"})


def test_a_job_leaves_no_ddp_environment_or_process_group_behind(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("MASTER_PORT", "1234")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with job_scope(tmp_path):
        assert os.environ[SWEEP_DIR_ENV] == str(tmp_path)
        os.environ.update(LOCAL_RANK="0", WORLD_SIZE="1", MASTER_PORT=str(port))  # as Lightning's DDP sets them
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    assert not dist.is_initialized()
    assert "LOCAL_RANK" not in os.environ
    assert "WORLD_SIZE" not in os.environ
    assert os.environ["MASTER_PORT"] == "1234"
    assert SWEEP_DIR_ENV not in os.environ


@pytest.mark.parametrize(
    ("overrides", "refusal"),
    [
        (
            ["hydra/launcher=joblib", "+trainer.strategy=ddp", "trainer.devices=2"],
            r"DDP over 2 processes .* the joblib launcher runs jobs in worker processes",
        ),
        (["+trainer.strategy=ddp_spawn", "trainer.devices=2"], r"trainer.strategy=ddp_spawn fits each group in"),
    ],
)
def test_ddp_a_launcher_cannot_run_is_refused_before_any_job(tmp_path, overrides, refusal):
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    with pytest.raises(ValueError, match=refusal):
        run_sweep(tmp_path, [*TWO_GROUPS, *overrides])
    assert not list(tmp_path.glob("group_*"))


def sweep_in_subprocess(sweep_dir: Path, *args: str) -> str:
    proc = train_subprocess(["-m", *TINY, f"hydra.sweep.dir={sweep_dir}", "hydra.sweeper.plots=false", *args])
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-4000:]
    return out


@pytest.mark.slow
def test_a_ddp_sweep_runs_once_and_records_what_one_process_records_on_the_same_batches(tmp_path):
    # two groups (momentum does not fuse), each of two slots that ASHA empties and refills from two more trials
    search = ["hydra.sweeper.sampler=grid", "hydra.sweeper.params=null", "model.lr=0.3,0.01,0.1,0.003"]
    search += ["model.momentum=0.0,0.9", "hydra.sweeper.non_fusible=[model.momentum]", "hydra.sweeper.fusion_limit=2"]
    search += ["hydra.sweeper.scheduler.name=asha", "trainer.max_epochs=3", "++trainer.limit_train_batches=4"]
    # the tests' DigitsData: one process at 64 sees the union of the two ranks' batches of 32 (ddp_trials.py)
    search += ["data._target_=tests.fused.ddp_trials.DigitsData"]
    one = sweep_in_subprocess(tmp_path / "one", *search, "+data.one_process_reference=true", "data.batch_size=64")
    two_ranks = ["data.batch_size=32", "+trainer.strategy=ddp", "trainer.devices=2"]
    ddp = sweep_in_subprocess(tmp_path / "ddp", *search, *two_ranks)
    assert ddp.count("Best 8 of 8 trials") == one.count("Best 8 of 8 trials") == 1  # one sweep, one report
    assert ddp.count("a further DDP rank of group") == 2  # each group's rank 1 ran that group's job only
    expected = {t["trial_id"]: t for t in read_results(tmp_path / "one")["trials"]}
    trials = read_results(tmp_path / "ddp")["trials"]
    assert {t["status"] for t in trials} == {"completed", "stopped"}
    for trial in trials:
        reference = expected[trial["trial_id"]]
        assert (trial["status"], trial["budget"]) == (reference["status"], reference["budget"])
        for name in ("val_loss", "val_acc"):  # over both ranks' halves of the validation set
            assert trial["metrics"][name] == pytest.approx(reference["metrics"][name], rel=1e-5)
    results = [json.loads(p.read_text()) for p in sorted((tmp_path / "ddp").glob("group_*/group_result.json"))]
    assert len(results) == 2
    assert len({r["pid"] for r in results}) == 1  # both groups' rank 0 ran in the sweep's process (basic launcher)
