"""Each fused trial's values under the names Lightning gives them when the trial is trained alone, with the trial's
suffix last: ``"loss_step"``/``"loss_epoch"`` for a value logged on step and epoch, ``"/dataloader_idx_{i}"`` with
several evaluation dataloaders (lightning_hydro/fused/logging/names.py, metrics.py, publisher.py)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader, Subset

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsDataModule, DigitsMLP
from lightning_hydro.fused.lightning.trainer_view import trial_metrics_view
from tests.helpers import SeriesLogger, make_trainer, max_state_difference

BACKENDS = ["vmap", "loop"]
LEARNING_RATES = (0.05, 0.2, 0.5)
# every on_step/on_epoch combination, by the suffix of the name it is logged under
LEVELS = {"s": (True, False), "e": (False, True), "se": (True, True)}
METRIC_DICTS = ("callback_metrics", "logged_metrics")


class EveryLevel(DigitsMLP):
    """Logs its loss with each on_step/on_epoch combination in its training, validation and test steps."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        for suffix, (on_step, on_epoch) in LEVELS.items():
            self.log(f"train_{suffix}", loss, on_step=on_step, on_epoch=on_epoch)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        for suffix, (on_step, on_epoch) in LEVELS.items():
            self.log(f"val_{suffix}", loss, on_step=on_step, on_epoch=on_epoch)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", F.cross_entropy(self(x), y), on_step=True, on_epoch=True)


class PerLoader(DigitsMLP):
    """Logs its validation and test losses with Lightning's defaults, from several loaders."""

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("val_loss", loss)
        self.log(f"own_{dataloader_idx}", loss, add_dataloader_idx=False)  # a name of its own, without the suffix

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, y = batch
        self.log("test_loss", F.cross_entropy(self(x), y))


class SameNameForEveryLoader(DigitsMLP):
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y), add_dataloader_idx=False)


class TwoLoaders(DigitsDataModule):
    """Two validation (and test) loaders of different sizes over the validation set."""

    def val_dataloader(self) -> list[DataLoader]:
        assert self.val_set is not None
        return [
            DataLoader(Subset(self.val_set, range(0, 160)), batch_size=64),
            DataLoader(Subset(self.val_set, range(160, 300)), batch_size=50),
        ]

    def test_dataloader(self) -> list[DataLoader]:
        return self.val_dataloader()


def trials(cls: type[DigitsMLP]) -> list[DigitsMLP]:
    modules = []
    for seed, lr in enumerate(LEARNING_RATES):
        torch.manual_seed(seed)
        modules.append(cls(lr=lr, hidden_dim=16))
    return modules


def floats(metrics: dict[str, Any]) -> dict[str, float]:
    return {name: float(value) for name, value in metrics.items()}


def stages(
    module: L.LightningModule, datamodule: L.LightningDataModule, logger: Logger | bool = False, **limits: Any
) -> dict[str, dict[str, dict[str, float]]]:
    """``fit``, ``validate`` and ``test`` on one Trainer: the metric dictionaries after each stage."""
    trainer = make_trainer(logger=logger, **limits)
    out = {}
    for stage in ("fit", "validate", "test"):
        torch.manual_seed(1234)
        getattr(trainer, stage)(module, datamodule=datamodule)
        out[stage] = {which: floats(getattr(trainer, which)) for which in METRIC_DICTS}
    return out


def assert_same_series(logger: SeriesLogger, tid: int, alone: dict[str, list[tuple[int | None, float]]]) -> None:
    """The logger calls of trial ``tid`` in a fused run equal those of the trial alone: names, steps and values."""
    suffix = f"/trial_{tid}"
    logged = {key[: -len(suffix)]: steps for key, steps in logger.series.items() if key.endswith(suffix)}
    assert sorted(logged) == sorted(alone)
    for name, steps in alone.items():
        assert [step for step, _ in logged[name]] == [step for step, _ in steps], name
        assert [value for _, value in logged[name]] == pytest.approx([value for _, value in steps], rel=1e-5)


def assert_same_values(fused: dict[str, float], alone: dict[str, float], where: str) -> None:
    assert sorted(fused) == sorted(alone), where
    for name, value in alone.items():
        assert fused[name] == pytest.approx(value, rel=1e-5, abs=1e-7), f"{where}: {name}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_on_step_on_epoch_combination_has_the_names_and_values_of_the_trial_alone(backend: str) -> None:
    # mid-epoch validation: validation step values must not leak into the training steps' logs
    limits: dict[str, Any] = dict(max_epochs=2, limit_train_batches=4, val_check_interval=2, log_every_n_steps=1)
    modules = trials(EveryLevel)
    alone = []
    for module in modules:
        logger = SeriesLogger()
        alone.append((stages(copy.deepcopy(module), DigitsDataModule(), logger, **limits), logger.series))
    logger = SeriesLogger()
    fused = FusedLightningModule(copy.deepcopy(modules), backend=backend, summary=False)
    fused_stages = stages(fused, DigitsDataModule(), logger, **limits)

    # what Lightning names alone (and so the fused group per trial): on_step only "train_s", on_epoch only
    # "train_e", both "train_se_step"/"train_se_epoch" for the loggers and "train_se" too in callback_metrics
    assert sorted(alone[0][0]["fit"]["callback_metrics"]) == [
        "train_e", "train_s", "train_se", "train_se_epoch", "train_se_step", "val_e", "val_se", "val_se_epoch",
    ]  # fmt: skip
    assert sorted(alone[0][0]["fit"]["logged_metrics"]) == [
        "train_e", "train_s", "train_se_epoch", "train_se_step", "val_e", "val_s", "val_se_epoch", "val_se_step",
    ]  # fmt: skip
    assert sorted(alone[0][0]["test"]["logged_metrics"]) == ["test_loss_epoch", "test_loss_step"]
    for tid, (metrics, series) in enumerate(alone):
        for stage, dicts in metrics.items():
            for which, values in dicts.items():
                assert_same_values(trial_metrics_view(fused_stages[stage][which], tid), values, f"{stage} {which}")
        assert_same_series(logger, tid, series)


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_validation_and_test_loader_keeps_its_own_values_per_trial(backend: str) -> None:
    limits: dict[str, Any] = dict(max_epochs=2, limit_train_batches=4)
    modules = trials(PerLoader)
    alone = [stages(copy.deepcopy(module), TwoLoaders(), **limits) for module in modules]
    fused = FusedLightningModule(copy.deepcopy(modules), backend=backend, summary=False)
    fused_stages = stages(fused, TwoLoaders(), **limits)

    names = ["own_0", "own_1", "val_loss/dataloader_idx_0", "val_loss/dataloader_idx_1"]
    assert sorted(alone[0]["validate"]["callback_metrics"]) == names
    assert sorted(alone[0]["test"]["logged_metrics"]) == ["test_loss/dataloader_idx_0", "test_loss/dataloader_idx_1"]
    for tid, metrics in enumerate(alone):
        # the two loaders' values differ: a mean over both would match neither
        loaders = [metrics["validate"]["callback_metrics"][f"val_loss/dataloader_idx_{i}"] for i in (0, 1)]
        assert loaders[0] != pytest.approx(loaders[1], rel=1e-4)
        for stage, dicts in metrics.items():
            for which, values in dicts.items():
                assert_same_values(trial_metrics_view(fused_stages[stage][which], tid), values, f"{stage} {which}")
    # the trial's suffix comes last, so that a callback's unfused key maps to each trial's key as for any name
    assert "val_loss/dataloader_idx_1/trial_2" in fused_stages["validate"]["callback_metrics"]
    alone_value = alone[2]["validate"]["callback_metrics"]["val_loss/dataloader_idx_1"]
    assert fused.results[2]["metrics"]["val_loss/dataloader_idx_1"] == pytest.approx(alone_value, rel=1e-5)


def test_one_name_from_several_loaders_without_their_suffix_is_refused_as_lightning_refuses_it() -> None:
    trainer = make_trainer(max_epochs=1, limit_train_batches=2)
    with pytest.raises(Exception, match=r"You called `self.log\(val_loss, ...\)` twice in `validation_step`"):
        trainer.fit(copy.deepcopy(trials(SameNameForEveryLoader)[0]), datamodule=TwoLoaders())
    fused = FusedLightningModule(trials(SameNameForEveryLoader), backend="loop", summary=False)
    message = (
        r"self.log\('val_loss', add_dataloader_idx=False\) was called from the steps of dataloaders 0 and 1 in one "
        r"epoch, which Lightning refuses for one module too. Fix: log a name of its own per dataloader"
    )
    with pytest.raises(ValueError, match=message):
        make_trainer(max_epochs=1, limit_train_batches=2).fit(fused, datamodule=TwoLoaders())


class BothLevels(DigitsMLP):
    """``train_loss`` on step and epoch (named ``train_loss_step`` and ``train_loss_epoch`` by Lightning)."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))


@pytest.mark.parametrize("monitor", ["train_loss_epoch", "val_loss/dataloader_idx_1"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_early_stopping_and_checkpoints_on_lightnings_names_act_per_trial_as_alone(
    backend: str, monitor: str, tmp_path: Path
) -> None:
    def callbacks(dirpath: Path) -> list[Any]:
        return [
            EarlyStopping(monitor=monitor, min_delta=1e-3, patience=1),
            ModelCheckpoint(dirpath=str(dirpath), monitor=monitor, save_top_k=1),
        ]

    limits: dict[str, Any] = dict(max_epochs=4, enable_checkpointing=True)
    modules = []
    for seed, lr in enumerate((0.0, 0.1)):  # the first trial learns nothing: it stops early
        torch.manual_seed(seed)
        modules.append(BothLevels(lr=lr, hidden_dim=16))
    alone = []
    for tid, module in enumerate(modules):
        trainer = make_trainer(callbacks=callbacks(tmp_path / f"alone_{tid}"), **limits)
        torch.manual_seed(1234)
        trainer.fit(copy.deepcopy(module), datamodule=TwoLoaders())
        assert trainer.early_stopping_callback is not None
        assert trainer.checkpoint_callback is not None
        alone.append((trainer.early_stopping_callback, trainer.checkpoint_callback, trainer.current_epoch))
    assert alone[0][0].stopped_epoch > 0  # the decisions differ: each trial must be judged on its own values
    assert alone[1][0].stopped_epoch != alone[0][0].stopped_epoch

    fused = FusedLightningModule(copy.deepcopy(modules), backend=backend, summary=False)
    trainer = make_trainer(callbacks=callbacks(tmp_path / "fused"), **limits)
    torch.manual_seed(1234)
    trainer.fit(fused, datamodule=TwoLoaders())
    stops = trainer.early_stopping_callback.trial_callbacks  # type: ignore[union-attr]
    checkpoints = trainer.checkpoint_callback.trial_callbacks  # type: ignore[union-attr]
    for tid, (stopping, checkpoint, epochs) in enumerate(alone):
        assert stops[tid].stopped_epoch == stopping.stopped_epoch
        assert fused.results[tid]["epochs"] == epochs
        assert float(checkpoints[tid].best_model_score) == pytest.approx(float(checkpoint.best_model_score), rel=1e-5)
        assert Path(checkpoints[tid].best_model_path).name == Path(checkpoint.best_model_path).name
        assert Path(checkpoints[tid].best_model_path).parent == tmp_path / "fused" / f"trial_{tid}"


class PlateauEveryStep(DigitsMLP):
    """Halves its learning rate whenever a step's ``train_loss`` (logged on step only) does not improve."""

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.hparams["lr"])
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": plateau, "monitor": "train_loss", "interval": "step"},
        }


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_step_interval_plateau_scheduler_reads_each_trials_step_value_as_alone(backend: str) -> None:
    limits: dict[str, Any] = dict(max_epochs=1, limit_train_batches=8, limit_val_batches=0)
    modules = trials(PlateauEveryStep)
    alone = []
    for module in modules:
        trainer = make_trainer(**limits)
        torch.manual_seed(1234)
        trainer.fit(copy.deepcopy(module), datamodule=DigitsDataModule())
        alone.append((trainer.lightning_module, trainer.optimizers[0].param_groups[0]["lr"]))
    assert alone[0][1] < LEARNING_RATES[0] / 4  # the scheduler acted: its step values were there
    fused = FusedLightningModule(copy.deepcopy(modules), backend=backend, summary=False)
    torch.manual_seed(1234)
    make_trainer(**limits).fit(fused, datamodule=DigitsDataModule())
    for tid, (module, _) in enumerate(alone):
        assert max_state_difference(fused.unfuse(tid), module) <= 1e-6


class StepValuesAtBatchEnd(L.Callback):
    """What a callback's ``on_train_batch_end`` reads of each trial's step value (``ModelCheckpoint`` reads there)."""

    def __init__(self, keys: dict[int, str]) -> None:
        self.keys = keys
        self.seen: dict[int, list[float | None]] = {tid: [] for tid in keys}

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        for tid, key in self.keys.items():
            value = trainer.callback_metrics.get(key)
            self.seen[tid].append(None if value is None else float(value))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_callbacks_batch_end_reads_each_trials_value_of_that_step_as_alone(backend: str) -> None:
    # before, the step values reached callback_metrics after the callbacks' on_train_batch_end: the previous step's
    limits: dict[str, Any] = dict(max_steps=5, limit_val_batches=0)
    modules = trials(EveryLevel)
    alone = []
    for module in modules:
        recorder = StepValuesAtBatchEnd({0: "train_s"})
        torch.manual_seed(1234)
        make_trainer(callbacks=[recorder], **limits).fit(copy.deepcopy(module), datamodule=DigitsDataModule())
        alone.append(recorder.seen[0])
    fused = FusedLightningModule(copy.deepcopy(modules), backend=backend, summary=False)
    recorder = StepValuesAtBatchEnd({tid: f"train_s/trial_{tid}" for tid in range(len(modules))})
    torch.manual_seed(1234)
    make_trainer(callbacks=[recorder], **limits).fit(fused, datamodule=DigitsDataModule())
    for tid, values in enumerate(alone):
        assert recorder.seen[tid] == pytest.approx(values, rel=1e-5), tid


class StepValueAtEpochEnd(DigitsMLP):
    def on_train_epoch_end(self) -> None:
        self.log("epoch_mark", float(self.current_epoch), on_step=True)  # Lightning refuses it alone


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_log_lightning_refuses_in_a_hook_is_refused_fused_with_lightnings_error(backend: str) -> None:
    # before, fused groups accepted what fails alone: a sweep passed with code that then failed on its own
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    message = r"You can't `self.log\(on_step=True\)` inside `on_train_epoch_end`"
    limits: dict[str, Any] = dict(max_epochs=1, limit_train_batches=2, limit_val_batches=0)
    with pytest.raises(MisconfigurationException, match=message):
        make_trainer(**limits).fit(copy.deepcopy(trials(StepValueAtEpochEnd)[0]), datamodule=DigitsDataModule())
    fused = FusedLightningModule(trials(StepValueAtEpochEnd), backend=backend, summary=False)
    with pytest.raises(MisconfigurationException, match=message):
        make_trainer(**limits).fit(fused, datamodule=DigitsDataModule())


class MetricObjects(DigitsMLP):
    """Logs torchmetrics objects on step (Lightning logs the batch's value) and on epoch (their compute())."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        import torchmetrics

        self.step_acc = torchmetrics.Accuracy(task="multiclass", num_classes=10)
        self.both_acc = torchmetrics.Accuracy(task="multiclass", num_classes=10)
        self.collection = torchmetrics.MetricCollection(
            {"col_acc": torchmetrics.Accuracy(task="multiclass", num_classes=10)}
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        logits = self(x)
        self.step_acc(logits, y)
        self.log("step_acc", self.step_acc)  # training_step's default: on_step only
        self.both_acc(logits, y)
        self.log("both_acc", self.both_acc, on_step=True, on_epoch=True)
        self.collection(logits, y)
        self.log_dict(self.collection, on_step=True, on_epoch=True)
        return F.cross_entropy(logits, y)


@pytest.mark.parametrize("backend", BACKENDS)
def test_metric_objects_logged_on_step_log_each_batchs_value_as_alone(backend: str) -> None:
    # before, a metric object's step value was never logged, and one logged on step only got its epoch compute()
    # under the step's name (0.1146 where alone logged the last batch's 0.0938)
    limits: dict[str, Any] = dict(max_epochs=1, limit_train_batches=3, limit_val_batches=0, log_every_n_steps=1)
    modules = trials(MetricObjects)
    alone = []
    for module in modules:
        logger = SeriesLogger()
        trainer = make_trainer(logger=logger, **limits)
        torch.manual_seed(1234)
        trainer.fit(copy.deepcopy(module), datamodule=DigitsDataModule())
        alone.append(({k: floats(getattr(trainer, k)) for k in METRIC_DICTS}, logger.series))
    assert sorted(alone[0][0]["logged_metrics"]) == [
        "both_acc_epoch", "both_acc_step", "col_acc_epoch", "col_acc_step", "step_acc",
    ]  # fmt: skip
    logger = SeriesLogger()
    trainer = make_trainer(logger=logger, **limits)
    torch.manual_seed(1234)
    trainer.fit(
        FusedLightningModule(copy.deepcopy(modules), backend=backend, summary=False), datamodule=DigitsDataModule()
    )
    for tid, (dicts, series) in enumerate(alone):
        for which, values in dicts.items():
            assert_same_values(trial_metrics_view(floats(getattr(trainer, which)), tid), values, which)
        assert_same_series(logger, tid, series)


class StopsAtStep(L.Callback):
    """Ends the fit after the batch of ``step`` (as Lightning's ``Timer`` and ``max_time`` do, off the log grid)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_batch_after_which_the_fit_stops_is_logged_as_alone(backend: str) -> None:
    # alone, Lightning logs the step values of the batch that ends the fit, whatever log_every_n_steps says;
    # before, the fused trials' series ended a row early (steps 3, 7 where alone logged 3, 7, 9)
    limits: dict[str, Any] = dict(max_epochs=5, log_every_n_steps=4)
    alone = []
    for module in trials(DigitsMLP):
        logger = SeriesLogger()
        torch.manual_seed(1234)
        make_trainer(logger=logger, callbacks=[StopsAtStep(10)], **limits).fit(module, datamodule=DigitsDataModule())
        alone.append(logger.series)
    assert [step for step, _ in alone[0]["train_loss"]] == [3, 7, 9]
    logger = SeriesLogger()
    fused = FusedLightningModule(trials(DigitsMLP), backend=backend, summary=False)
    torch.manual_seed(1234)
    make_trainer(logger=logger, callbacks=[StopsAtStep(10)], **limits).fit(fused, datamodule=DigitsDataModule())
    for tid, series in enumerate(alone):
        assert_same_series(logger, tid, series)


class LogsInDouble(EveryLevel):
    """Logs a Python number from its step and a tensor from an epoch-end hook too, all under ``64-true``."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.log("half_lr", self.lr_scale / 2)  # a Python float: the default dtype, float64 in a 64-true step
        return super().training_step(batch, batch_idx)

    def on_validation_epoch_end(self) -> None:
        self.log("head_norm", self.head.weight.norm())

    @property
    def lr_scale(self) -> float:
        return 0.25


@pytest.mark.parametrize("backend", BACKENDS)
def test_under_64_true_a_trials_values_are_logged_in_float64_as_alone(backend: str) -> None:
    """Before, the step values on the loop and every epoch value were float32 (about 5e-8 relative from alone's)."""
    trials = []
    for seed, rate in enumerate(LEARNING_RATES[:2]):
        torch.manual_seed(seed)
        trials.append(LogsInDouble(hidden_dim=16, lr=rate))
    kwargs = dict(max_epochs=2, limit_train_batches=3, limit_val_batches=2, precision="64-true")
    alone = []
    for trial in trials:
        trainer = make_trainer(**kwargs)
        trainer.fit(copy.deepcopy(trial), datamodule=DigitsDataModule(batch_size=32))
        alone.append(trainer.logged_metrics)
    fused = FusedLightningModule(trials, backend=backend, summary=False)
    trainer = make_trainer(**kwargs)
    trainer.fit(fused, datamodule=DigitsDataModule(batch_size=32))
    exact = 0.0 if backend == "loop" else 1e-12
    for tid, metrics in enumerate(alone):
        assert {"train_s", "train_e", "train_se_epoch", "val_e", "half_lr", "head_norm"} <= set(metrics)
        for name, value in metrics.items():
            fused_value = trainer.logged_metrics[f"{name}/trial_{tid}"]
            assert value.dtype == fused_value.dtype == torch.float64, name
            assert float((fused_value.cpu() - value.cpu()).abs()) <= exact * float(value.abs()), name
