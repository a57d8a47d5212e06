"""A fit killed with SIGKILL and resumed from its last checkpoint makes the decisions of an uninterrupted fit."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from lightning_hydro.callbacks import ASHA, Deadline, Hyperband, SuccessiveHalving
from tests.callbacks.trials import LEARNING_RATES, fit, fused, mlp, mlps

pytestmark = pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")

MAX_EPOCHS = 5
KILL_AT_EPOCH = 3  # after the checkpoint of epoch 2: two rungs decided, slots refilled


class KillAt(Callback):
    """SIGKILLs its own process when the given epoch starts: no hook, no cleanup, like a preempted job."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == self.epoch:
            os.kill(os.getpid(), signal.SIGKILL)


def make_callback(kind: str) -> ASHA | Hyperband:
    refill = mlps([0.2, 0.02, 0.002, 0.15, 0.03])
    if kind == "asha":
        return ASHA("val_loss", grace_period=1, reduction_factor=2, max_t=4, refill=refill)
    return Hyperband("val_acc", mode="max", grace_period=1, reduction_factor=2, max_t=4, refill=refill)


def fit_checkpointed(
    module: L.LightningModule, callbacks: list[Callback], directory: Path, *, max_epochs: int, resume: bool
) -> L.Trainer:
    callbacks = [*callbacks, ModelCheckpoint(dirpath=directory, save_last=True)]
    ckpt_path = str(directory / "last.ckpt") if resume else None
    return fit(module, callbacks, max_epochs=max_epochs, enable_checkpointing=True, ckpt_path=ckpt_path)


def run(kind: str, directory: Path, *, kill_at: int | None = None, resume: bool = False) -> tuple[Any, Any]:
    module, callback = fused(LEARNING_RATES[:4]), make_callback(kind)
    extra = [] if kill_at is None else [KillAt(kill_at)]
    trainer = fit_checkpointed(module, [callback, *extra], directory, max_epochs=MAX_EPOCHS, resume=resume)
    assert trainer.current_epoch == MAX_EPOCHS
    return module, callback


def _killed_child(kind: str, directory: Path) -> None:
    torch.set_num_threads(1)
    run(kind, directory, kill_at=KILL_AT_EPOCH)
    os._exit(0)  # not reached: the fit kills this process


@pytest.mark.parametrize("kind", ["asha", "hyperband"])
def test_resume_after_sigkill_gives_the_same_decisions_and_results(kind, tmp_path):
    reference, reference_callback = run(kind, tmp_path / "uninterrupted")

    directory = tmp_path / "killed"
    # spawned, not forked: on a machine with a GPU this process may have initialised CUDA, which a forked child
    # cannot use (Lightning's checkpoint reads the CUDA random state: "Cannot re-initialize CUDA in forked
    # subprocess"); the child fits on the CPU like the reference
    child = multiprocessing.get_context("spawn").Process(target=_killed_child, args=(kind, directory))
    child.start()
    child.join(timeout=600)
    assert child.exitcode == -signal.SIGKILL
    checkpoint = torch.load(directory / "last.ckpt", weights_only=False)
    assert checkpoint["epoch"] == KILL_AT_EPOCH - 1  # killed before anything of epoch 3 was saved

    resumed, resumed_callback = run(kind, directory, resume=True)

    assert resumed_callback.endings == reference_callback.endings
    assert [(r.trial_id, r.milestone, r.budget) for r in resumed_callback.rule.store.records()] == [
        (r.trial_id, r.milestone, r.budget) for r in reference_callback.rule.store.records()
    ]
    assert resumed_callback._refill.drawn == reference_callback._refill.drawn
    assert reference_callback._refill.drawn >= 3
    assert sorted(resumed.results) == sorted(reference.results)
    for tid, expected in reference.results.items():
        got = resumed.results[tid]
        assert (got["status"], got["epochs"], got["steps"], got["reason"]) == (
            expected["status"],
            expected["epochs"],
            expected["steps"],
            expected["reason"],
        ), tid
        assert got["metrics"] == pytest.approx(expected["metrics"], rel=1e-5), tid
    assert resumed_callback.summary == reference_callback.summary
    if kind == "hyperband":
        assert resumed_callback.rule.assignments == reference_callback.rule.assignments


class Preempted(Exception):
    pass


class InterruptAt(Callback):
    """Ends the fit with an exception when the given epoch starts (after the previous epoch's checkpoint)."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == self.epoch:
            raise Preempted


def test_a_resumed_single_trial_keeps_its_id_and_budget(tmp_path):
    storage, directory = str(tmp_path / "rungs.db"), tmp_path / "checkpoints"
    first = ASHA("val_loss", max_t=4, reduction_factor=2, storage=storage)  # a random trial id
    with pytest.raises(Preempted):
        fit_checkpointed(mlp(0.3), [first, InterruptAt(2)], directory, max_epochs=4, resume=False)
    assert first.status == "running"

    resumed = ASHA("val_loss", max_t=4, reduction_factor=2, storage=storage)
    trainer = fit_checkpointed(mlp(0.3), [resumed], directory, max_epochs=4, resume=True)
    assert resumed._view.key == first._view.key  # the same trial in the shared store, not a new one
    assert (resumed.status, resumed.result["budget"], trainer.current_epoch) == ("completed", 4, 4)
    assert [r.milestone for r in resumed.rule.records()] == [1, 2, 4]


def test_a_checkpoint_that_names_the_endings_outcomes_still_resumes(tmp_path):
    """Checkpoints written before ``endings`` was renamed hold them under ``"outcomes"``."""
    directory = tmp_path / "checkpoints"
    first = ASHA("val_loss", grace_period=1, reduction_factor=2, max_t=4)
    with pytest.raises(Preempted):
        fit_checkpointed(fused(LEARNING_RATES[:4]), [first, InterruptAt(2)], directory, max_epochs=4, resume=False)
    stopped = dict(first.endings)
    assert len(stopped) == 3  # cut at the rungs of epochs 0 and 1, all in the checkpoint of epoch 1
    checkpoint = torch.load(directory / "last.ckpt", weights_only=False)
    (key,) = [k for k in checkpoint["callbacks"] if k.startswith("ASHA")]
    checkpoint["callbacks"][key]["outcomes"] = checkpoint["callbacks"][key].pop("endings")
    torch.save(checkpoint, directory / "last.ckpt")

    resumed = ASHA("val_loss", grace_period=1, reduction_factor=2, max_t=4)
    fit_checkpointed(fused(LEARNING_RATES[:4]), [resumed], directory, max_epochs=4, resume=True)
    assert {tid: resumed.endings[tid] for tid in stopped} == stopped


@pytest.mark.parametrize("kind", ["successive_halving", "deadline"])
def test_interrupted_and_resumed_in_process_ends_as_uninterrupted(kind, tmp_path):
    def make() -> SuccessiveHalving | Deadline:
        if kind == "successive_halving":
            return SuccessiveHalving("val_loss", reduction_factor=2, max_t=4)
        return Deadline("val_loss", deadline=3600, reduction_factor=2, max_t=4, refill=mlps([0.2, 0.02]))

    reference_module, reference = fused(LEARNING_RATES[:4]), make()
    fit_checkpointed(reference_module, [reference], tmp_path / "reference", max_epochs=4, resume=False)

    first, directory = make(), tmp_path / "run"
    with pytest.raises(Preempted):
        fit_checkpointed(fused(LEARNING_RATES[:4]), [first, InterruptAt(2)], directory, max_epochs=4, resume=False)
    module, resumed = fused(LEARNING_RATES[:4]), make()
    fit_checkpointed(module, [resumed], directory, max_epochs=4, resume=True)

    assert resumed.endings == reference.endings
    assert {t: (r["status"], r["epochs"]) for t, r in module.results.items()} == {
        t: (r["status"], r["epochs"]) for t, r in reference_module.results.items()
    }
    if kind == "deadline":
        assert resumed._deadline_at == first._deadline_at  # the deadline of the run it resumes
        assert resumed.measurements[: len(first.measurements)] == first.measurements
