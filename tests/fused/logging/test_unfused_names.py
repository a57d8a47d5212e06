"""After fit, validate and test, the unfused names hold the group's chosen trial's values (tests mirror the
``publish_chosen_trial`` part of lightning_hydro/fused/logging/publisher.py).

Code written for one model reads ``trainer.callback_metrics["val/acc"]`` after ``trainer.fit`` (lightning-hydra-
template's ``train.py`` returns it to the sweeper). In a fused group that name holds the value of the best trial
by the module's ``monitor`` and ``mode``, every name of that one trial, as its record (``results``) holds it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos.template_mnist import DigitsMNISTDataModule, MNISTLitModule, SimpleDenseNet
from lightning_hydro.fused.logging.publisher import chosen_trial
from tests.helpers import make_trainer


class Scored(L.LightningModule):
    """A trial whose validation and test scores are set by its hyperparameters: which trial is best is known."""

    def __init__(self, val_score: float, test_score: float, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(4, 1)
        self.register_buffer("scores", torch.tensor([val_score, test_score]))  # per trial under vmap

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.layer(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val/score", self.scores[0])

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test/score", self.scores[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"])

    def _loader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(32, 4, generator=generator)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)

    def train_dataloader(self) -> DataLoader:
        return self._loader()

    def val_dataloader(self) -> DataLoader:
        return self._loader()

    def test_dataloader(self) -> DataLoader:
        return self._loader()


# trial 0 is the best by validation, trial 1 by test: the unfused test score must be trial 0's
SCORES = [(0.875, 0.125), (0.5, 0.625), (0.75, 0.25)]  # exact in float32, the buffer's dtype


def scored_group(**kwargs: Any) -> FusedLightningModule:
    trials = [Scored(val, test) for val, test in SCORES]
    return FusedLightningModule(trials, backend="vmap", summary=False, **kwargs)


def unfused(metrics: dict[str, Any]) -> dict[str, float]:
    return {name: value.item() for name, value in metrics.items() if "/trial_" not in name and name != "trials"}


def test_after_fit_every_name_of_the_best_trial_by_monitor_and_mode():
    for mode, best in (("max", 0), ("min", 1)):
        fused = scored_group(monitor="val/score", mode=mode)
        trainer = make_trainer(max_epochs=2)
        trainer.fit(fused)
        expected = fused.results[best]["metrics"]
        assert set(expected) == {"val/score", "train/loss"}
        assert unfused(dict(trainer.callback_metrics)) == pytest.approx(expected, abs=0)  # the record's very numbers
        assert unfused(dict(trainer.logged_metrics)) == pytest.approx(expected, abs=0)
        assert trainer.callback_metrics["val/score"].item() == SCORES[best][0]
        assert isinstance(trainer.callback_metrics["val/score"].item(), float)  # as the template's .item() reads it
        # the per-trial names stay, every trial's own
        for tid, (val, _) in enumerate(SCORES):
            assert trainer.callback_metrics[f"val/score/trial_{tid}"].item() == pytest.approx(val)
            assert fused.results[tid]["metrics"]["val/score"] == pytest.approx(val)


def test_after_test_the_test_values_are_those_of_the_best_trial_by_validation():
    fused = scored_group(monitor="val/score", mode="max")
    trainer = make_trainer(max_epochs=1)
    trainer.fit(fused)
    train_metrics = trainer.callback_metrics
    trainer.test(fused)
    test_metrics = trainer.callback_metrics
    metric_dict = {**train_metrics, **test_metrics}  # what the template's train() returns
    # trial 1 has the best test score; trial 0, the best by the monitored validation score, is the one reported
    assert metric_dict["test/score"].item() == 0.125
    assert metric_dict["val/score"].item() == 0.875
    assert trainer.logged_metrics["test/score"].item() == 0.125
    assert {tid: r["metrics"]["test/score"] for tid, r in fused.results.items()} == pytest.approx(
        {0: 0.125, 1: 0.625, 2: 0.25}
    )
    trainer.validate(fused)
    assert trainer.callback_metrics["val/score"].item() == 0.875


def test_without_monitor_only_a_group_of_one_has_unfused_names():
    fused = scored_group()
    trainer = make_trainer(max_epochs=1)
    trainer.fit(fused)
    assert unfused(dict(trainer.callback_metrics)) == {}  # no rule says which trial the name would stand for
    assert "val/score/trial_2" in trainer.callback_metrics
    alone = FusedLightningModule([Scored(0.375, 0.625)], trial_ids=[7], backend="vmap", summary=False)
    trainer = make_trainer(max_epochs=1)
    trainer.fit(alone)
    assert trainer.callback_metrics["val/score"].item() == 0.375
    trainer.test(alone)
    assert trainer.callback_metrics["test/score"].item() == 0.625


def test_a_name_the_best_trial_never_logged_is_not_filled_from_another_trial():
    fused = scored_group(monitor="val/score", mode="max")
    trainer = make_trainer(max_epochs=1)
    trainer.fit(fused)
    fused.trial_record(1).metrics["only/trial_1"] = 0.5  # a name that trial 1 alone has (not the best: trial 0)
    trainer.validate(fused)
    assert trainer.callback_metrics["val/score"].item() == 0.875
    assert "only/trial_1" not in trainer.callback_metrics


def test_a_monitor_that_no_trial_logged_is_named_in_a_warning():
    fused = scored_group(monitor="val/acc", mode="max")
    trainer = make_trainer(max_epochs=1)
    with pytest.warns(
        UserWarning,
        match=r"after fit, no trial has a finite value of monitor='val/acc' \(the trials "
        r"logged \['train/loss', 'val/score'\]\).*Fix: monitor one of the logged names",
    ):
        trainer.fit(fused)
    assert unfused(dict(trainer.callback_metrics)) == {}


def test_a_name_the_group_itself_logged_is_left_as_it_is():
    class LogsOnTheGroup(Callback):
        def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            pl_module.log("val/score", 123.0)

    fused = scored_group(monitor="val/score", mode="max")
    trainer = make_trainer(max_epochs=1, callbacks=[LogsOnTheGroup()])
    trainer.fit(fused)
    assert trainer.callback_metrics["val/score"].item() == 123.0
    assert trainer.callback_metrics["train/loss"].item() == fused.results[0]["metrics"]["train/loss"]


def test_when_early_stopping_ended_every_trial_the_best_checkpoint_tests_the_best_trial(tmp_path: Path):
    # Lightning's own EarlyStopping, per trial: constant scores never improve, so every trial stops early
    callbacks = [
        EarlyStopping(monitor="val/score", mode="max", patience=0),
        ModelCheckpoint(dirpath=tmp_path, monitor="val/score", mode="max", save_last=True),
    ]
    fused = scored_group(monitor="val/score", mode="max")
    trainer = make_trainer(max_epochs=5, callbacks=callbacks, enable_checkpointing=True)
    trainer.fit(fused)
    assert {r["status"] for r in fused.results.values()} == {"stopped"}
    assert trainer.current_epoch < 5
    assert trainer.callback_metrics["val/score"].item() == 0.875
    trainer.test(fused, ckpt_path="best", weights_only=False)
    assert trainer.callback_metrics["test/score"].item() == 0.125


def test_a_resumed_fit_reports_a_best_trial_that_ended_before_the_checkpoint(tmp_path: Path):
    class StopsTheBestAfterTheFirstEpoch(Callback):
        def on_validation_end(self, trainer: L.Trainer, pl_module: Any) -> None:
            if trainer.current_epoch == 0 and 0 in pl_module.trial_ids:
                pl_module.stop_trial(0, "done early")

    checkpoints = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer = make_trainer(
        max_epochs=1, callbacks=[StopsTheBestAfterTheFirstEpoch(), checkpoints], enable_checkpointing=True
    )
    trainer.fit(scored_group(monitor="val/score", mode="max"))
    resumed = scored_group(monitor="val/score", mode="max")
    checkpoints = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer = make_trainer(max_epochs=2, callbacks=[checkpoints], enable_checkpointing=True)
    trainer.fit(resumed, ckpt_path=str(tmp_path / "last.ckpt"), weights_only=False)
    assert resumed.results[0]["status"] == "stopped"
    assert "val/score/trial_0" not in trainer.callback_metrics  # trial 0 logged nothing in the resumed fit
    assert trainer.callback_metrics["val/score"].item() == 0.875  # its record still makes it the best


def test_the_template_module_reports_its_best_trial_under_its_own_names():
    def trial(lr: float) -> MNISTLitModule:
        return MNISTLitModule(
            net=SimpleDenseNet(lin1_size=16, lin2_size=16, lin3_size=16),
            optimizer=functools.partial(torch.optim.Adam, lr=lr),
            scheduler=None,
        )

    torch.manual_seed(0)
    fused = FusedLightningModule(
        [trial(lr) for lr in (1e-4, 3e-3, 3e-2)], backend="vmap", summary=False, monitor="val/acc", mode="max"
    )
    trainer = make_trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=2, limit_test_batches=2)
    datamodule = DigitsMNISTDataModule(batch_size=64)
    trainer.fit(fused, datamodule=datamodule)
    train_metrics = trainer.callback_metrics
    trainer.test(fused, datamodule=datamodule)
    metric_dict = {**train_metrics, **trainer.callback_metrics}
    best = chosen_trial({tid: fused.trial_record(tid) for tid in fused.results}, "val/acc", "max")
    assert best is not None
    for name in ("val/acc", "val/acc_best", "val/loss", "train/acc", "train/loss", "test/acc", "test/loss"):
        assert metric_dict[name].item() == fused.results[best]["metrics"][name], name
