"""Tiny digits trials and Trainers for the callback tests: real fits that take about a second each."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsDataModule, DigitsMLP
from tests.helpers import make_trainer

# Learning rates from hopeless to good: the rung decisions on them are not ties.
LEARNING_RATES = (0.001, 0.3, 0.003, 0.1, 0.01, 0.2, 0.002, 0.05, 0.02)
FIT = dict(limit_train_batches=3, limit_val_batches=1)


def mlp(lr: float, seed: int = 0) -> DigitsMLP:
    torch.manual_seed(seed)
    return DigitsMLP(hidden_dim=8, lr=lr)


def mlps(lrs: Sequence[float]) -> list[DigitsMLP]:
    return [mlp(lr, seed) for seed, lr in enumerate(lrs)]


def fused(lrs: Sequence[float], **kwargs: Any) -> FusedLightningModule:
    return FusedLightningModule(mlps(lrs), backend="vmap", summary=False, **kwargs)


def fit(
    module: L.LightningModule,
    callbacks: list[Callback],
    *,
    max_epochs: int,
    ckpt_path: str | None = None,
    **overrides: Any,
) -> L.Trainer:
    trainer = make_trainer(max_epochs=max_epochs, callbacks=callbacks, **{**FIT, **overrides})
    torch.manual_seed(1234)
    trainer.fit(module, datamodule=DigitsDataModule(batch_size=64), ckpt_path=ckpt_path)
    return trainer


class GroupProbe(Callback):
    """Records the running trials and the stacked parameters' leading size at each training epoch start."""

    def __init__(self) -> None:
        self.trial_ids: list[list[int]] = []
        self.rows: list[int] = []

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        assert isinstance(pl_module, FusedLightningModule)
        self.trial_ids.append(pl_module.trial_ids)
        self.rows.append(pl_module.stacked.get_parameter("head__weight").shape[0])


def val_losses(module: FusedLightningModule, tid: int) -> list[float]:
    return [entry["val_loss"] for entry in module.results[tid]["history"] if "val_loss" in entry]
