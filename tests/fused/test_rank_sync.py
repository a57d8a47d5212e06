"""A fused group under DDP (two CPU processes, gloo) is the group one process trains on the same global batches.

Per-trial values logged with ``sync_dist=True``, every trial's result, ASHA's stop and refill decisions and every
trial's weights are compared with one process at twice the batch size (see ``ddp_trials.py``), for
``strategy="ddp_spawn"`` (results handed back to this process) and ``strategy="ddp"`` (Lightning re-runs a script).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.strategies import FSDPStrategy

from lightning_hydro import FusedLightningModule
from lightning_hydro.callbacks import ASHA
from tests.fused.ddp_trials import LEARNING_RATES, REFILL_RATES, DigitsData, trainer, trials
from tests.helpers import max_state_difference

REPO = Path(__file__).resolve().parents[2]


def fit_group(**trainer_kwargs: object) -> FusedLightningModule:
    """The group of ``ddp_fit.py``: four trials, ASHA stopping at the first rung and refilling from two more."""
    fused = FusedLightningModule(trials(LEARNING_RATES), backend="vmap", summary=False)
    asha = ASHA("val_loss", max_t=3, refill=trials(REFILL_RATES, first_seed=10))
    one_process = "strategy" not in trainer_kwargs
    trainer(callbacks=[asha], **trainer_kwargs).fit(
        fused, datamodule=DigitsData(64 if one_process else 32, one_process_reference=one_process)
    )
    return fused


@pytest.fixture(scope="module")
def one_process() -> FusedLightningModule:
    return fit_group()


def assert_same_group(results: dict, weights: dict, reference: FusedLightningModule) -> None:
    expected = reference.results
    assert sorted(results) == sorted(expected) == [0, 1, 2, 3, 4, 5]  # two refills joined
    assert {r["status"] for r in expected.values()} == {"completed", "stopped"}
    for tid, result in results.items():
        assert (result["status"], result["budget"], result["reason"]) == (
            expected[tid]["status"],
            expected[tid]["budget"],
            expected[tid]["reason"],
        ), tid
        for name in ("val_loss", "val_acc"):  # logged with sync_dist=True: over both ranks' halves
            assert result["metrics"][name] == pytest.approx(expected[tid]["metrics"][name], rel=1e-5), (tid, name)
        assert [h["epoch"] for h in result["history"]] == [h["epoch"] for h in expected[tid]["history"]]
    for tid, state in weights.items():
        unfused = reference.unfuse(tid)
        ddp = type(unfused)(**unfused.hparams)
        ddp.load_state_dict(state)
        assert max_state_difference(ddp, unfused) < 1e-5, tid


def test_ddp_spawn_group_stops_refills_and_hands_its_results_back(one_process):
    fused = fit_group(strategy="ddp_spawn", devices=2)
    # the fit ran in two spawned processes; this process's module holds what rank 0 ended with
    weights = {tid: fused.unfuse(tid).state_dict() for tid in fused.results}
    assert_same_group(fused.results, weights, one_process)


def run_ddp_script(out: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    script = REPO / "tests" / "fused" / "ddp_fit.py"
    return subprocess.run(
        [sys.executable, str(script), str(out), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_ddp_group_is_the_same_on_both_ranks_and_as_one_process(tmp_path, one_process):
    proc = run_ddp_script(tmp_path, "ddp", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    for rank in ranks:
        assert_same_group(rank["results"], rank["weights"], one_process)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_one_rank_failing_after_a_slot_change_ends_the_fit_without_a_hang(tmp_path, strategy):
    start = time.monotonic()
    proc = run_ddp_script(tmp_path, strategy, "fail", timeout=300)
    assert proc.returncode != 0
    assert "trial failed on rank 1 at step 5" in proc.stderr
    assert time.monotonic() - start < 240  # not a collective's timeout (30 minutes)


@pytest.mark.slow
def test_a_loss_gone_bad_on_one_rank_only_ends_that_trial_on_every_rank(tmp_path):
    proc = run_ddp_script(tmp_path, "ddp", "nan", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    for result in (r for rank in ranks for r in rank["results"].values()):
        del result["metrics"]["train_loss"]  # logged without sync_dist: each rank's own
    assert ranks[0]["results"] == ranks[1]["results"]
    assert ranks[0]["results"][1]["status"] == "diverged"  # lr 0.3, NaN on rank 1 only
    assert "non-finite loss" in ranks[0]["results"][1]["reason"]
    for tid, state in ranks[0]["weights"].items():  # every trial's rows stepped alike on both ranks
        for key, value in state.items():
            assert torch.equal(value, ranks[1]["weights"][tid][key]), (tid, key)


def test_a_strategy_that_shards_parameters_is_refused():
    from lightning_hydro.fused.rank_sync import RankSync

    fake = SimpleNamespace(world_size=2, strategy=FSDPStrategy())
    with pytest.raises(ValueError, match=r"a fused group runs on one device or under DDP .* got FSDPStrategy over 2"):
        RankSync().setup(fake)  # type: ignore[arg-type]


def test_the_state_dict_a_spawned_worker_returns_carries_the_group_back():
    # what ddp_spawn does, in one process: the worker's module (rows compacted, refills joined) gives its state
    # dict; the main process's module, still holding the trials it was built with, loads it
    worker = fit_group()
    worker._ranks.handing_back = True  # set at fit end in a process other than the one that built the module
    state = worker.state_dict()
    main = FusedLightningModule(trials(LEARNING_RATES), backend="vmap", summary=False)
    assert sorted(main.results) == [0, 1, 2, 3]
    assert main.results[0]["status"] == "running"
    main.load_state_dict(state, strict=False)  # as Lightning's launcher loads it
    assert main.results == worker.results
    assert main.trial_ids == worker.trial_ids
    for tid in worker.results:
        assert max_state_difference(main.unfuse(tid), worker.unfuse(tid)) == 0.0
    worker._ranks.handing_back = False  # an ordinary state dict (checkpoints) has no such entry
    assert all(isinstance(value, torch.Tensor) for value in worker.state_dict().values())
