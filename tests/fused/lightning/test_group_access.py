"""A user's own callback handed the fused group as ``pl_module``: as alone, or a clear error or warning, never silence.

Before: ``pl_module.use_smoothing = True`` in a callback reached no trial (weights 0.01-0.34 relative from alone
with the callback, bitwise those without it); a warm-up assigning ``trainer.optimizers[0].param_groups[0]["lr"]``
reached no optimizer; ``pl_module.freeze()`` was undone at the next step by the trials' own flags; reading
``pl_module.body`` or ``pl_module.hparams.lr`` raised a bare ``AttributeError``; nothing said that such a callback
sees the group of every trial.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends.errors import FusionError
from lightning_hydro.demos import DigitsMLP
from lightning_hydro.fused.lightning.group_access import group_unaware_hooks, metric_reading_hooks
from lightning_hydro.optim.group_param_group import GroupHyperparameterError
from tests.helpers import (
    StopTrialAt,
    fit_digits,
    make_trainer,
    max_state_difference,
    seeded,
    train_fused,
    train_separately,
)

FIT = dict(max_epochs=3, limit_train_batches=4, limit_val_batches=1)


class Smoothed(DigitsMLP):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(hidden_dim=16, **kwargs)
        self.use_smoothing = False

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y, label_smoothing=0.2 if self.use_smoothing else 0.0)


def _trials(cls: type = Smoothed) -> list[DigitsMLP]:
    rates = iter([0.05, 0.1, 0.2])
    return seeded(lambda: cls(lr=next(rates)), [0, 1, 2])


class TurnsSmoothingOn(L.Callback):
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        if trainer.current_epoch == 1:
            pl_module.use_smoothing = True


class WarmsUpByHand(L.Callback):
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        for group in trainer.optimizers[0].param_groups:
            group["lr"] = 0.01


class FreezesTheBodyAtEpochOne(L.Callback):
    """Fine-tuning's freeze from a callback: ``pl_module.freeze()``, then the head (the last two) trains again."""

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        if trainer.current_epoch == 1:
            pl_module.freeze()
            pl_module.train()
            for param in list(pl_module.parameters())[-2:]:
                param.requires_grad_(True)


class ReadsTheLayer(L.Callback):
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        self.norm = float(pl_module.head.weight.norm())


class ReadsTheRate(L.Callback):
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        self.rate = pl_module.hparams.lr


@pytest.mark.parametrize("backend", ["loop", "vmap"])
def test_freezing_the_module_from_a_callback_freezes_every_trial_as_alone(backend: str) -> None:
    trials = _trials()
    alone = train_separately(trials, fit_digits, callbacks=[FreezesTheBodyAtEpochOne()], **FIT)
    fused = train_fused(
        trials, fit_digits, fused_kwargs={"backend": backend}, callbacks=[FreezesTheBodyAtEpochOne()], **FIT
    )
    for row, own in enumerate(alone):
        assert max_state_difference(fused.unfuse(row), own) <= (0.0 if backend == "loop" else 1e-6)
        assert [p.requires_grad for p in fused.trial_module(row).parameters()] == [False] * 4 + [True] * 2


@pytest.mark.parametrize(
    ("callback", "match"),
    [
        (
            TurnsSmoothingOn(),
            r"setting 'use_smoothing' on the fused group .* would reach none of its trials \[0, 1, 2\]",
        ),
        (WarmsUpByHand(), r"param_group\['lr'\] = \.\.\. on the group's optimizer .* reaches no trial"),
    ],
)
def test_what_a_callback_sets_on_the_group_that_would_reach_no_trial_is_refused(callback: L.Callback, match: str):
    fused = FusedLightningModule(_trials(), backend="loop", summary=False)
    with pytest.raises((FusionError, GroupHyperparameterError), match=match):
        fit_digits(make_trainer(callbacks=[callback], **FIT), fused)


@pytest.mark.parametrize(
    ("callback", "match"),
    [
        (
            ReadsTheLayer(),
            r"no attribute 'head': it is the fused group of trials \[0, 1, 2\], and 'head' is an attribute",
        ),
        (ReadsTheRate(), r"'lr': the fused group's hparams hold none of its trials' hyperparameters"),
    ],
)
def test_what_a_callback_reads_of_a_trial_on_the_group_says_where_it_is(callback: L.Callback, match: str):
    fused = FusedLightningModule(_trials(), backend="loop", summary=False)
    with pytest.raises(AttributeError, match=match):
        fit_digits(make_trainer(callbacks=[callback], **FIT), fused)
    assert not hasattr(fused, "head")  # still an AttributeError: hasattr answers as before


def test_a_callback_that_uses_its_module_is_named_in_a_warning_at_fit_start() -> None:
    fused = FusedLightningModule(_trials(DigitsMLP), backend="loop", summary=False)
    with pytest.warns(
        UserWarning, match=r"ReadsTheLayer's on_train_epoch_end use pl_module .* the group of every trial"
    ):
        fit_digits(make_trainer(callbacks=[ReadsTheLayerSafely()], **FIT), fused)


class ReadsTheLayerSafely(ReadsTheLayer):
    """Reads a layer that the group has too (its stacked state), so the fit runs: only the warning tells."""

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        self.norm = sum(float(p.norm()) for p in pl_module.parameters())


ReadsTheLayerSafely.__name__ = "ReadsTheLayer"


def test_callbacks_that_act_on_the_group_or_not_on_the_module_are_not_warned_of() -> None:
    class Counts(L.Callback):
        def on_train_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
            self.epochs = trainer.current_epoch

    assert group_unaware_hooks(StopTrialAt(3)) == []  # names the group's API (stop_trial)
    assert group_unaware_hooks(Counts()) == []  # reads the Trainer's epoch only
    assert group_unaware_hooks(L.pytorch.callbacks.ModelCheckpoint()) == []  # Lightning's: per trial, or refused
    assert group_unaware_hooks(ReadsTheLayer()) == ["on_train_epoch_end"]


class KeepsTheBestLoss(L.Callback):
    """A hand-written best-so-far tracker, as projects write one: reads the trial's own name in callback_metrics."""

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        loss = trainer.callback_metrics.get("val_loss")
        if loss is not None:
            self.best = min(getattr(self, "best", float("inf")), float(loss))


class KeepsEachTrialsBestLoss(L.Callback):
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        self.best = {tid: float(trainer.callback_metrics[f"val_loss/trial_{tid}"]) for tid in pl_module.trial_ids}


def test_a_callback_that_reads_a_trials_own_metric_name_is_named_in_a_warning_at_fit_start() -> None:
    """Fused, ``callback_metrics`` holds ``val_loss/trial_{id}``: ``.get("val_loss")`` gives None, silently."""
    fused = FusedLightningModule(_trials(DigitsMLP), backend="loop", summary=False)
    callback = KeepsTheBestLoss()
    with pytest.warns(UserWarning, match=r"KeepsTheBestLoss's on_validation_epoch_end read the Trainer's metrics"):
        fit_digits(make_trainer(callbacks=[callback], **FIT), fused)
    assert not hasattr(callback, "best")  # what the warning is about: the callback saw nothing
    assert metric_reading_hooks(callback) == ["on_validation_epoch_end"]
    assert metric_reading_hooks(KeepsEachTrialsBestLoss()) == []  # names the group's API (trial_ids)
    assert group_unaware_hooks(callback) == []  # it does not use its module
