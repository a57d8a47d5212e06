"""test / validate / predict on a fused group evaluate every trial, the ended ones too, each with its own weights.

The shape of lightning-hydra-template's ``train.py``: ``trainer.fit(...)`` with early stopping that may end every
trial of the group, then ``trainer.test(model, datamodule, ckpt_path=best)``. Each trial's results must be those of
its own module evaluated alone, and the evaluation must change nothing a later (or resumed) fit sees.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsMNISTDataModule, MNISTLitModule, SimpleDenseNet
from lightning_hydro.fused.lightning.trainer_view import trial_metrics_view
from lightning_hydro.stacking.stacked_state import storage_key
from tests.helpers import make_trainer, max_state_difference, seeded

LIMITS = dict(limit_train_batches=4, limit_val_batches=2, limit_test_batches=2, limit_predict_batches=2)
RATES = (1e-3, 1e-2, 3e-2)
# the template's hparams hold functools.partial optimizers: its train.py loads checkpoints with weights_only=False
TRUSTED: dict[str, Any] = {"weights_only": False}


class PredictingTemplate(MNISTLitModule):
    """The template's module with the ``predict_step`` a user adds to call ``trainer.predict``."""

    def predict_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, _ = batch
        return self.forward(x).softmax(dim=-1)


def template_trials() -> list[PredictingTemplate]:
    def build(lr: float) -> PredictingTemplate:
        return PredictingTemplate(
            net=SimpleDenseNet(lin1_size=32, lin2_size=32, lin3_size=16),
            optimizer=functools.partial(torch.optim.Adam, lr=lr),
            scheduler=None,
        )

    return [seeded(lambda lr=lr: build(lr), [i])[0] for i, lr in enumerate(RATES)]


class EndTrials(L.Callback):
    """Ends trials after validation, as a halving callback does: ``{epoch: [trial ids]}``."""

    def __init__(self, plan: dict[int, list[int]]) -> None:
        self.plan = plan

    def on_validation_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        for tid in self.plan.get(trainer.current_epoch, []):
            if tid in pl_module.trial_ids:
                pl_module.stop_trial(tid, "ended by the test")


EVERY_TRIAL_ENDS = {0: [1], 1: [0, 2]}
ONE_TRIAL_ENDS = {0: [1]}


def fit_group(
    plan: dict[int, list[int]], backend: str = "vmap", *, epochs: int = 2, checkpoints: Path | None = None
) -> tuple[FusedLightningModule, L.Trainer, DigitsMNISTDataModule]:
    fused = FusedLightningModule(template_trials(), backend=backend, summary=False)  # type: ignore[arg-type]
    callbacks: list[L.Callback] = [EndTrials(plan)]
    if checkpoints is not None:  # no monitor: the group's own checkpoint at each validation (the latest is "best")
        callbacks.append(ModelCheckpoint(dirpath=checkpoints, save_last=True))
    trainer = make_trainer(
        max_epochs=epochs, callbacks=callbacks, enable_checkpointing=checkpoints is not None, **LIMITS
    )
    datamodule = DigitsMNISTDataModule(batch_size=64)
    trainer.fit(fused, datamodule=datamodule)
    return fused, trainer, datamodule


def alone(fused: FusedLightningModule, stage: str, datamodule: DigitsMNISTDataModule) -> dict[int, Any]:
    """Each trial's own module (a standalone copy with its weights) evaluated alone, by trial id."""
    out: dict[int, Any] = {}
    for tid in fused.results:
        module = fused.unfuse(tid)
        result = getattr(make_trainer(**LIMITS), stage)(module, **data(stage, datamodule))
        out[tid] = result if stage == "predict" else result[0]  # every batch's predictions; the metrics
    return out


def data(stage: str, datamodule: DigitsMNISTDataModule) -> dict[str, Any]:
    """The stage's data arguments: the template's data module has no predict loader, so predict its test split."""
    if stage != "predict":
        return {"datamodule": datamodule, "verbose": False}
    datamodule.setup("test")
    return {"dataloaders": datamodule.test_dataloader()}


def assert_per_trial_metrics_equal(fused_metrics: dict[str, float], own: dict[int, dict[str, float]]) -> None:
    for tid, metrics in own.items():
        assert trial_metrics_view(fused_metrics, tid) == pytest.approx(metrics, rel=1e-5, abs=1e-6), tid
    assert len(fused_metrics) == sum(len(m) for m in own.values())  # nothing else, no trial left out


def snapshot(fused: FusedLightningModule) -> dict[str, Any]:
    """What a fit sees: the stacked state, the running ids, each retired trial's weights."""
    return {
        "stacked": {k: v.clone() for k, v in fused.state_dict().items()},
        "running": fused.trial_ids,
        "modules": {tid: copy.deepcopy(fused.trial_module(tid).state_dict()) for tid in fused.results},
    }


def assert_running_trials_bound(fused: FusedLightningModule) -> None:
    """Each running trial's parameters are views of the module's stacked tensors again (what the optimizer steps)."""
    for tid in fused.trial_ids:
        for name, param in fused.trial_module(tid).named_parameters():
            stacked = fused.stacked.get_parameter(storage_key(name))
            assert param.untyped_storage().data_ptr() == stacked.untyped_storage().data_ptr(), (tid, name)


def assert_same_snapshot(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert after["running"] == before["running"]
    assert before["stacked"].keys() == after["stacked"].keys()
    for key, value in before["stacked"].items():
        assert torch.equal(value, after["stacked"][key]), key
    for tid, state in before["modules"].items():
        for key, value in state.items():
            assert torch.equal(value, after["modules"][tid][key]), (tid, key)


@pytest.mark.parametrize("backend", ["vmap", "hfta", "loop"])
def test_test_after_every_trial_ended_evaluates_each_with_its_own_weights(backend):
    fused, trainer, datamodule = fit_group(EVERY_TRIAL_ENDS, backend)
    assert fused.trial_ids == []
    before = snapshot(fused)
    metrics = trainer.test(fused, datamodule=datamodule, verbose=False)[0]
    assert_per_trial_metrics_equal(metrics, alone(fused, "test", datamodule))
    assert_same_snapshot(before, snapshot(fused))
    for tid in (0, 1, 2):
        assert fused.results[tid]["metrics"]["test/acc"] == pytest.approx(metrics[f"test/acc/trial_{tid}"])


@pytest.mark.parametrize("stage", ["test", "validate", "predict"])
def test_each_stage_after_some_trials_ended_covers_running_and_ended_trials(stage):
    fused, trainer, datamodule = fit_group(ONE_TRIAL_ENDS)
    assert fused.trial_ids == [0, 2]
    before = snapshot(fused)
    out = getattr(trainer, stage)(fused, **data(stage, datamodule))
    assert_running_trials_bound(fused)
    own = alone(fused, stage, datamodule)
    if stage == "predict":
        assert len(out) == 2
        for batch, predictions in enumerate(out):
            assert sorted(predictions) == [0, 1, 2]
            for tid, prediction in predictions.items():
                assert torch.allclose(prediction, own[tid][batch], rtol=1e-5, atol=1e-6), (batch, tid)
    else:
        assert_per_trial_metrics_equal(out[0], own)
    assert_same_snapshot(before, snapshot(fused))


@pytest.mark.parametrize("which", ["best", "path", "last"])
def test_test_from_a_checkpoint_written_after_every_trial_ended(tmp_path, which):
    fused, trainer, datamodule = fit_group(EVERY_TRIAL_ENDS, checkpoints=tmp_path)
    own = alone(fused, "test", datamodule)
    if which == "best":  # the template's train.py, on the trainer that fitted
        metrics = trainer.test(fused, datamodule=datamodule, ckpt_path="best", verbose=False, **TRUSTED)[0]
    else:  # a new process: a fresh group of the same trials, its weights from the checkpoint only
        path = trainer.checkpoint_callback.best_model_path if which == "path" else str(tmp_path / "last.ckpt")
        assert torch.load(path, weights_only=False)["lightning_hydro"]["trial_ids"] == []
        fresh = FusedLightningModule(template_trials(), backend="vmap", summary=False)  # type: ignore[arg-type]
        metrics = make_trainer(**LIMITS).test(fresh, datamodule=datamodule, ckpt_path=path, verbose=False, **TRUSTED)[0]
        assert fresh.trial_ids == []
        for tid in (0, 1, 2):
            assert max_state_difference(fresh.unfuse(tid), fused.unfuse(tid)) == 0.0
    assert_per_trial_metrics_equal(metrics, own)


def test_test_from_a_checkpoint_with_running_and_ended_trials(tmp_path):
    fused, trainer, datamodule = fit_group(ONE_TRIAL_ENDS)
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    own = alone(fused, "test", datamodule)
    fresh = FusedLightningModule(template_trials(), backend="vmap", summary=False)  # type: ignore[arg-type]
    metrics = make_trainer(**LIMITS).test(
        fresh, datamodule=datamodule, ckpt_path=tmp_path / "mid.ckpt", verbose=False, **TRUSTED
    )
    assert_per_trial_metrics_equal(metrics[0], own)
    assert fresh.trial_ids == [0, 2]


def test_a_fit_cannot_resume_from_a_checkpoint_in_which_every_trial_ended(tmp_path):
    _, _, datamodule = fit_group(EVERY_TRIAL_ENDS, checkpoints=tmp_path)
    fresh = FusedLightningModule(template_trials(), backend="vmap", summary=False)  # type: ignore[arg-type]
    with pytest.raises(
        ValueError,
        match=r"holds no running trial \(trials 0, 1, 2 had all ended when it was written\), so a fit cannot resume "
        r"from it: .* Evaluate it with trainer.test",
    ):
        make_trainer(max_epochs=3, **LIMITS).fit(
            fresh, datamodule=datamodule, ckpt_path=tmp_path / "last.ckpt", **TRUSTED
        )


@pytest.mark.parametrize("test_ckpt", [False, True])
def test_a_fit_resumed_after_a_test_equals_one_resumed_without_it(tmp_path, test_ckpt):
    fused, trainer, datamodule = fit_group(ONE_TRIAL_ENDS)
    mid = tmp_path / "mid.ckpt"
    trainer.save_checkpoint(mid)

    def resume(module: FusedLightningModule) -> FusedLightningModule:
        torch.manual_seed(5)  # the same shuffles for both
        make_trainer(max_epochs=4, callbacks=[EndTrials({2: [0]})], **LIMITS).fit(
            module, datamodule=datamodule, ckpt_path=mid, **TRUSTED
        )
        return module

    without = resume(FusedLightningModule(template_trials(), backend="vmap", summary=False))  # type: ignore[arg-type]
    if test_ckpt:  # a fresh group tested from the checkpoint, then fitted on from it
        tested = FusedLightningModule(template_trials(), backend="vmap", summary=False)  # type: ignore[arg-type]
        make_trainer(**LIMITS).test(tested, datamodule=datamodule, ckpt_path=mid, verbose=False, **TRUSTED)
    else:  # the group that fitted, tested in memory, then fitted on from the checkpoint
        tested = fused
        trainer.test(tested, datamodule=datamodule, verbose=False)
    with_test = resume(tested)
    assert with_test.trial_ids == without.trial_ids == [2]
    for tid in (0, 1, 2):
        assert max_state_difference(with_test.unfuse(tid), without.unfuse(tid)) == 0.0
        for key in ("status", "budget", "steps", "epochs"):
            assert with_test.results[tid][key] == without.results[tid][key]
        assert with_test.results[tid]["metrics"]["val/acc"] == without.results[tid]["metrics"]["val/acc"]


def test_a_second_fit_in_memory_after_a_test_equals_one_without_it():
    # no checkpoint: the same module fitted on after trainer.test, against a copy fitted on without it
    fused, trainer, datamodule = fit_group(ONE_TRIAL_ENDS)
    untested = copy.deepcopy(fused)
    trainer.test(fused, datamodule=datamodule, verbose=False)
    for module in (fused, untested):
        torch.manual_seed(5)  # the same shuffles for both
        make_trainer(max_epochs=1, **LIMITS).fit(module, datamodule=datamodule)
    assert fused.trial_ids == untested.trial_ids == [0, 2]
    for tid in (0, 1, 2):
        assert max_state_difference(fused.unfuse(tid), untested.unfuse(tid)) == 0.0


def test_trials_of_different_widths_are_evaluated_from_memory_and_from_their_checkpoint(tmp_path):
    # pad_widths: the widest trial ends first, so the checkpoint's rowless tensors have the last trials' padding
    def trials() -> list[MNISTLitModule]:
        return [
            seeded(
                lambda width=width, lr=lr: MNISTLitModule(
                    net=SimpleDenseNet(lin1_size=width, lin2_size=width, lin3_size=16),
                    optimizer=functools.partial(torch.optim.Adam, lr=lr),
                    scheduler=None,
                ),
                [i],
            )[0]
            for i, (width, lr) in enumerate(((32, 1e-3), (16, 1e-2), (24, 3e-2)))
        ]

    fused = FusedLightningModule(trials(), backend="vmap", pad_widths=True, summary=False)
    callbacks = [EndTrials({0: [0], 1: [1, 2]}), ModelCheckpoint(dirpath=tmp_path, save_last=True)]
    trainer = make_trainer(max_epochs=2, callbacks=callbacks, enable_checkpointing=True, **LIMITS)
    datamodule = DigitsMNISTDataModule(batch_size=64)
    trainer.fit(fused, datamodule=datamodule)
    own = alone(fused, "test", datamodule)
    assert_per_trial_metrics_equal(trainer.test(fused, datamodule=datamodule, verbose=False)[0], own)
    fresh = FusedLightningModule(trials(), backend="vmap", pad_widths=True, summary=False)
    metrics = make_trainer(**LIMITS).test(
        fresh, datamodule=datamodule, ckpt_path=tmp_path / "last.ckpt", verbose=False, **TRUSTED
    )
    assert_per_trial_metrics_equal(metrics[0], own)


class FailOnTestBatch(L.Callback):
    def on_test_batch_end(self, *args: Any) -> None:
        raise RuntimeError("a failing test batch")


def test_a_stage_that_raises_leaves_the_fit_layout_to_the_next_stage():
    fused, _, datamodule = fit_group(ONE_TRIAL_ENDS)
    failing = make_trainer(callbacks=[FailOnTestBatch()], **LIMITS)
    with pytest.raises(RuntimeError, match="a failing test batch"):
        failing.test(fused, datamodule=datamodule, verbose=False)
    # Lightning calls no module hook after the error; the next stage's setup puts the fit layout back
    torch.manual_seed(5)
    make_trainer(max_epochs=1, **LIMITS).fit(fused, datamodule=datamodule)
    assert fused.trial_ids == [0, 2]
    assert_running_trials_bound(fused)
    assert fused.results[1]["status"] == "stopped"
    assert fused.results[0]["epochs"] == fused.results[2]["epochs"] == 3


class ChangeSlotsDuringEvaluation(L.Callback):
    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        pl_module.stop_trial(0)

    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        pl_module.add_trial(template_trials()[0])


def test_slots_do_not_change_during_an_evaluation():
    fused, _, datamodule = fit_group(ONE_TRIAL_ENDS)
    before = snapshot(fused)
    evaluating = make_trainer(callbacks=[ChangeSlotsDuringEvaluation()], **LIMITS)
    with pytest.raises(RuntimeError, match=r"stop_trial: the group's slots change only while it fits; .* trainer.test"):
        evaluating.test(fused, datamodule=datamodule, verbose=False)
    with pytest.raises(RuntimeError, match=r"add_trial: .* trainer.validate, which evaluates every trial of the group"):
        evaluating.validate(fused, datamodule=datamodule, verbose=False)
    make_trainer(max_epochs=0, **LIMITS).fit(fused, datamodule=datamodule)  # setup puts the fit layout back
    assert_same_snapshot(before, snapshot(fused))
