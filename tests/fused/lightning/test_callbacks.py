"""Lightning's own callbacks, configured as for one model, act per trial on a fused group (tests mirror
lightning_hydro/fused/lightning/callbacks.py)."""

from __future__ import annotations

import copy
import csv
import functools
import os
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import (
    EarlyStopping,
    LearningRateMonitor,
    ModelCheckpoint,
    StochasticWeightAveraging,
)
from lightning.pytorch.loggers import CSVLogger

from lightning_hydro import FusedLightningModule
from lightning_hydro.callbacks import ASHA
from lightning_hydro.demos import DigitsMLP
from lightning_hydro.demos.template_mnist import DigitsMNISTDataModule, MNISTLitModule, SimpleDenseNet
from lightning_hydro.fused.lightning.callbacks import CallbackNotPerTrialError, per_trial_callbacks
from tests.helpers import fit_digits, make_trainer, max_state_difference

NET = dict(lin1_size=32, lin2_size=32, lin3_size=16)


def template_trials() -> list[MNISTLitModule]:
    modules = []
    for seed, lr in enumerate((1e-4, 3e-3, 2e-2)):
        torch.manual_seed(seed)
        modules.append(
            MNISTLitModule(
                net=SimpleDenseNet(**NET),
                optimizer=functools.partial(torch.optim.Adam, lr=lr),
                scheduler=functools.partial(torch.optim.lr_scheduler.ReduceLROnPlateau, mode="min", patience=0),
            )
        )
    return modules


def template_callbacks(dirpath: Path) -> list[Any]:
    """lightning-hydra-template's callbacks (configs/callbacks/default.yaml), early stopping made impatient."""
    return [
        ModelCheckpoint(
            dirpath=str(dirpath),
            filename="epoch_{epoch:03d}",
            monitor="val/acc",
            mode="max",
            save_last=True,
            auto_insert_metric_name=False,
        ),
        EarlyStopping(monitor="val/acc", patience=1, mode="max"),
        LearningRateMonitor(),
    ]


def fit_template(module: L.LightningModule, root: Path) -> L.Trainer:
    trainer = L.Trainer(
        max_epochs=5,
        accelerator="cpu",
        precision="64-true",  # the weights' comparison tests the fusion, not a CPU's float32 kernels (see below)
        logger=CSVLogger(str(root), name="", version=""),
        callbacks=template_callbacks(root / "checkpoints"),
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root),
    )
    torch.manual_seed(1234)
    trainer.fit(module, datamodule=DigitsMNISTDataModule(batch_size=128))
    return trainer


def logged_column(root: Path, column: str) -> list[float]:
    with open(root / "metrics.csv") as handle:
        return [float(row[column]) for row in csv.DictReader(handle) if row.get(column)]


def load(path: str) -> MNISTLitModule:
    # the template's hparams hold optimizer partials: torch.load needs weights_only=False, fused or not
    return MNISTLitModule.load_from_checkpoint(path, net=SimpleDenseNet(**NET), weights_only=False)


@pytest.mark.parametrize("backend", ["loop", "vmap"])
def test_template_callbacks_act_per_trial_as_in_separate_runs(tmp_path: Path, backend: str) -> None:
    """On loop (each trial's own torch optimizer) a trial is bitwise its separate run; on vmap, whose kernels round
    differently, the template's torchmetrics (val/acc, which the callbacks monitor) are replayed per trial and
    the decisions are the same, the weights equal to float rounding. The Trainers run on the CPU
    (``accelerator="cpu"``, pinned) in float64: the bitwise claims are about CPU kernels."""
    trials = template_trials()
    separate = [fit_template(copy.deepcopy(m), tmp_path / f"alone_{i}") for i, m in enumerate(trials)]
    fused = FusedLightningModule(
        [copy.deepcopy(m) for m in trials], backend=backend, optimizer_path="universal", summary=False
    )
    trainer = fit_template(fused, tmp_path / "fused")

    checkpoints = trainer.checkpoint_callback
    stops = trainer.early_stopping_callback
    assert type(checkpoints).__name__ == "TrialModelCheckpoint"
    assert type(stops).__name__ == "TrialEarlyStopping"
    stopped = [alone.early_stopping_callback.stopped_epoch for alone in separate]
    assert len(set(stopped)) > 1, stopped  # the trials stop at different epochs: per-trial decisions are tested
    for tid, alone in enumerate(separate):
        # EarlyStopping: the same decision, and the trial left its slot at that epoch
        assert stops.trial_callbacks[tid].stopped_epoch == alone.early_stopping_callback.stopped_epoch
        assert fused.results[tid]["epochs"] == alone.current_epoch
        if alone.early_stopping_callback.stopped_epoch:
            assert fused.results[tid]["status"] == "stopped"
            assert "EarlyStopping(monitor='val/acc')" in fused.results[tid]["reason"]
        # ModelCheckpoint: the same files, the same best, loadable by the user's own class with its hparams
        own_dir = tmp_path / "fused" / "checkpoints" / f"trial_{tid}"
        assert sorted(os.listdir(own_dir)) == sorted(os.listdir(tmp_path / f"alone_{tid}" / "checkpoints"))
        mine, theirs = checkpoints.trial_callbacks[tid], alone.checkpoint_callback
        assert os.path.basename(mine.best_model_path) == os.path.basename(theirs.best_model_path)
        if backend == "loop":
            assert float(mine.best_model_score) == float(theirs.best_model_score)
        else:  # within one of the 250 validation images
            assert abs(float(mine.best_model_score) - float(theirs.best_model_score)) <= 1 / 250 + 1e-6
        for name in ("best", "last"):
            path_mine = mine.best_model_path if name == "best" else mine.last_model_path
            path_theirs = theirs.best_model_path if name == "best" else theirs.last_model_path
            loaded, expected = load(path_mine), load(path_theirs)
            assert loaded.hparams["optimizer"].keywords == expected.hparams["optimizer"].keywords
            if backend == "loop":  # the loop backend is bitwise
                for key, value in expected.state_dict().items():
                    assert torch.equal(loaded.state_dict()[key], value), (tid, name, key)
            else:
                # every weight and statistic, trained in float64, loaded back into the template's float32 net: equal
                # to float64 rounding (measured 1.1e-8 relative, worst entry). In float32 the vmap kernels round
                # otherwise than the unfused ones, and Adam amplifies that noise through 5 epochs (most in the
                # biases feeding BatchNorm, whose gradient is zero but for rounding) by an amount that depends on
                # the CPU's kernels: 1.4e-7 over the learned weights on one CPU, 1.6e-4 on an AVX-512 AMD EPYC.
                assert max_state_difference(loaded, expected) <= 1e-6, (tid, name)
        # LearningRateMonitor: the trial's own learning rates (ReduceLROnPlateau on its own val/loss)
        assert logged_column(tmp_path / "fused", f"lr-Adam/trial_{tid}") == logged_column(
            tmp_path / f"alone_{tid}", "lr-Adam"
        )
    # the group's own checkpoint (trainer.checkpoint_callback, as without a monitor) is the fused run's, to resume it
    group = torch.load(checkpoints.last_model_path, weights_only=False)
    assert os.path.dirname(checkpoints.last_model_path) == str(tmp_path / "fused" / "checkpoints")
    assert group["lightning_hydro"]["trial_ids"] == fused.trial_ids
    assert set(group["lightning_hydro"]["records"]) == {0, 1, 2}


def test_explicit_trial_keys_and_group_callbacks_are_left_alone() -> None:
    explicit = [
        ModelCheckpoint(monitor="val/acc/trial_2"),
        EarlyStopping(monitor="val_loss/trial_0"),
        ModelCheckpoint(),
    ]
    assert per_trial_callbacks(explicit) == explicit


@pytest.mark.parametrize(
    ("callback", "advice"),
    [
        (StochasticWeightAveraging(swa_lrs=0.01), "unfuse"),
        (L.pytorch.callbacks.LearningRateFinder(), "swept hyperparameter"),
        (L.pytorch.callbacks.BackboneFinetuning(), "trial module's own hooks"),
    ],
)
def test_a_callback_that_cannot_act_per_trial_is_named_at_fit_start(callback: Any, advice: str) -> None:
    fused = FusedLightningModule([DigitsMLP(hidden_dim=8), DigitsMLP(hidden_dim=8)], backend="loop", summary=False)
    with pytest.raises(CallbackNotPerTrialError, match=rf"{type(callback).__name__} was passed .*{advice}"):
        fit_digits(make_trainer(max_steps=1, callbacks=[callback]), fused)


class _Plateaus(DigitsMLP):
    """Logs val_loss; with a tiny learning rate it stops improving at once (early stopping after patience)."""

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.cross_entropy(self(x), y))


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_early_stopping_frees_each_trials_slot_and_ends_the_fit_when_none_is_left(backend: str) -> None:
    trials = [_Plateaus(hidden_dim=8, lr=lr) for lr in (0.0, 0.05, 0.0)]
    fused = FusedLightningModule(trials, backend=backend, summary=False)
    trainer = make_trainer(max_epochs=6, limit_train_batches=3, callbacks=[EarlyStopping("val_loss", patience=1)])
    fit_digits(trainer, fused)
    results = fused.results
    assert results[0]["status"] == results[2]["status"] == "stopped"  # lr 0: val_loss never improves
    assert results[0]["epochs"] == results[2]["epochs"] == 2  # the first check sets the best, the second stops
    assert results[1]["epochs"] > 2
    if results[1]["status"] == "stopped":
        assert trainer.current_epoch < 6  # every trial stopped: the fit ended early
    assert trainer.early_stopping_callback.trial_callbacks[0].wait_count == 1


def test_checkpoint_of_a_trial_holds_its_optimizer_state_and_loads_into_its_class(tmp_path: Path) -> None:
    trials = [DigitsMLP(hidden_dim=8, lr=lr, optimizer="adam") for lr in (1e-3, 1e-2)]
    fused = FusedLightningModule(trials, backend="vmap", summary=False)
    callback = ModelCheckpoint(dirpath=str(tmp_path), monitor="val_loss", filename="best")
    fit_digits(
        make_trainer(max_epochs=1, limit_train_batches=3, callbacks=[callback], enable_checkpointing=True), fused
    )
    path = tmp_path / "trial_1" / "best.ckpt"
    checkpoint = torch.load(path, weights_only=False)
    assert checkpoint["hyper_parameters"]["lr"] == 1e-2
    assert len(checkpoint["optimizer_states"][0]["state"]) == len(list(trials[1].parameters()))
    loaded = DigitsMLP.load_from_checkpoint(path)
    for key, value in fused.unfuse(1).state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value)
    # a trial's checkpoint holds that trial only (its tensors are not views of the group's)
    assert all(value.shape == trials[1].state_dict()[key].shape for key, value in checkpoint["state_dict"].items())


@pytest.mark.parametrize("max_t", [1, 2])
def test_a_trial_that_early_stopping_ends_gets_its_final_checkpoint(tmp_path: Path, max_t: int) -> None:
    # ASHA ends trials in on_validation_end; Lightning's ModelCheckpoint (validation once per epoch) saves at the
    # training epoch's end, after that: each ended trial's copy must still save the epoch it ended in
    trials = [DigitsMLP(hidden_dim=8, lr=lr) for lr in (1e-3, 0.1)]
    fused = FusedLightningModule(trials, backend="vmap", summary=False)
    callbacks = [
        ASHA(monitor="val_acc", mode="max", max_t=max_t, grace_period=1, reduction_factor=2),
        # every epoch kept: whatever its val_acc, the epoch a trial ended in must be there
        ModelCheckpoint(dirpath=str(tmp_path), monitor="val_acc", mode="max", save_top_k=-1, filename="{epoch}"),
    ]
    trainer = make_trainer(max_epochs=max_t, limit_train_batches=3, callbacks=callbacks, enable_checkpointing=True)
    fit_digits(trainer, fused)
    for tid, result in fused.results.items():
        assert result["status"] != "running"
        saved = sorted(p.name for p in (tmp_path / f"trial_{tid}").glob("*.ckpt"))
        # one per epoch it trained, the epoch it ended in included (every trial started at epoch 0)
        assert saved == [f"epoch={e}.ckpt" for e in range(result["epochs"])], (tid, result["status"])


def test_per_trial_callback_states_survive_a_resume(tmp_path: Path) -> None:
    def run(root: Path, max_epochs: int, ckpt_path: str | None = None) -> L.Trainer:
        trials = [_Plateaus(hidden_dim=8, lr=lr) for lr in (0.02, 0.05, 0.1)]
        for seed, module in enumerate(trials):
            torch.manual_seed(seed)
            module.load_state_dict(_Plateaus(hidden_dim=8, lr=module.hparams["lr"]).state_dict())
        fused = FusedLightningModule(trials, backend="vmap", summary=False)
        callbacks = [
            ModelCheckpoint(dirpath=str(root), monitor="val_loss", save_last=True),
            EarlyStopping("val_loss", patience=3, min_delta=0.05),
        ]
        trainer = make_trainer(
            max_epochs=max_epochs, limit_train_batches=4, callbacks=callbacks, enable_checkpointing=True
        )
        torch.manual_seed(1234)
        fit_digits(trainer, fused, ckpt_path=ckpt_path)
        return trainer

    whole = run(tmp_path / "whole", 4)
    run(tmp_path / "resumed", 2)
    resumed = run(tmp_path / "resumed", 4, ckpt_path=str(tmp_path / "resumed" / "last.ckpt"))
    for tid in range(3):
        stop_whole = whole.early_stopping_callback.trial_callbacks[tid]
        stop_resumed = resumed.early_stopping_callback.trial_callbacks[tid]
        assert stop_resumed.wait_count == stop_whole.wait_count
        assert float(stop_resumed.best_score) == pytest.approx(float(stop_whole.best_score), rel=1e-5)
        best_whole = whole.checkpoint_callback.trial_callbacks[tid].best_model_path
        best_resumed = resumed.checkpoint_callback.trial_callbacks[tid].best_model_path
        assert os.path.basename(best_resumed) == os.path.basename(best_whole)
        assert len(resumed.checkpoint_callback.trial_callbacks[tid].best_k_models) == 1


def test_a_stop_decided_before_min_epochs_waits_for_them_as_in_lightning() -> None:
    trials = [_Plateaus(hidden_dim=8, lr=lr) for lr in (0.0, 0.0)]
    fused = FusedLightningModule(trials, backend="vmap", summary=False)
    stopping = EarlyStopping("val_loss", patience=1)
    trainer = make_trainer(max_epochs=8, min_epochs=4, limit_train_batches=2, callbacks=[stopping])
    fit_digits(trainer, fused)
    assert [fused.results[t]["epochs"] for t in (0, 1)] == [4, 4]  # decided after 2 epochs, applied after 4
    assert trainer.current_epoch == 4  # then no trial was left: the fit ended


def test_callbacks_from_a_trials_configure_callbacks_are_refused_with_the_fix() -> None:
    class BringsItsOwn(DigitsMLP):
        def configure_callbacks(self) -> list[Any]:
            return [EarlyStopping("val_loss", patience=self.hparams["depth"])]

    fused = FusedLightningModule(
        [BringsItsOwn(hidden_dim=8), BringsItsOwn(hidden_dim=8)], backend="loop", summary=False
    )
    with pytest.raises(CallbackNotPerTrialError, match=r"BringsItsOwn.configure_callbacks\(\).*Pass those callbacks"):
        fit_digits(make_trainer(max_steps=1), fused)


def test_two_checkpoints_and_two_early_stoppings_on_different_keys_coexist(tmp_path: Path) -> None:
    trials = [DigitsMLP(hidden_dim=8, lr=lr) for lr in (0.01, 0.1)]
    fused = FusedLightningModule(trials, backend="vmap", summary=False)
    callbacks = [
        ModelCheckpoint(dirpath=str(tmp_path / "acc"), monitor="val_acc", mode="max", filename="best"),
        ModelCheckpoint(dirpath=str(tmp_path / "loss"), monitor="val_loss", filename="best"),
        EarlyStopping("val_acc", mode="max", patience=5),
        EarlyStopping("val_loss", patience=5),
    ]
    trainer = make_trainer(max_epochs=1, limit_train_batches=2, callbacks=callbacks, enable_checkpointing=True)
    fit_digits(trainer, fused)  # Lightning refuses two stateful callbacks with one state key
    assert (tmp_path / "acc" / "trial_1" / "best.ckpt").exists()
    assert (tmp_path / "loss" / "trial_1" / "best.ckpt").exists()
    assert len({c.state_key for c in trainer.callbacks}) == len(trainer.callbacks)
