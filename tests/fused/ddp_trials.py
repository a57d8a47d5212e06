"""Data and trials for the DDP tests: the same global batches in one process and in two (CPU, gloo).

Under DDP Lightning gives each rank a ``DistributedSampler``: rank r takes every second index of one permutation
drawn from ``seed + epoch``. The one-process reference draws its batches from the same sampler with one replica,
at twice the batch size, so each of its batches is the union of the two ranks' batches, and DDP's averaged
gradient equals its gradient.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, DistributedSampler

from lightning_hydro.demos import DigitsMLP, load_digits_tensors

LEARNING_RATES = (0.001, 0.3, 0.003, 0.1)
REFILL_RATES = (0.05, 0.02)


class DigitsData(L.LightningDataModule):
    """A user's datamodule: a shuffled training loader, a plain validation loader (180 images: 90 per rank).

    Args:
        batch_size: examples per training batch (per process under DDP).
        one_process_reference: draw the training batches as two DDP ranks together would (see the module docstring).
    """

    def __init__(self, batch_size: int, *, one_process_reference: bool = False) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.reference = one_process_reference
        self.train_set, self.val_set = load_digits_tensors(val_fraction=0.1)

    def train_dataloader(self) -> DataLoader:
        if self.reference:
            sampler = DistributedSampler(self.train_set, num_replicas=1, rank=0, shuffle=True, seed=0)
            return DataLoader(self.train_set, batch_size=self.batch_size, sampler=sampler)
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)


def trial(lr: float, seed: int) -> DigitsMLP:
    torch.manual_seed(seed)
    return DigitsMLP(hidden_dim=8, lr=lr)


def trials(rates: tuple[float, ...], first_seed: int = 0) -> list[DigitsMLP]:
    return [trial(lr, first_seed + i) for i, lr in enumerate(rates)]


def trainer(**overrides: Any) -> L.Trainer:
    kwargs: dict[str, Any] = dict(
        accelerator="cpu",
        devices=1,
        max_epochs=3,
        limit_train_batches=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    return L.Trainer(**{**kwargs, **overrides})


class FailingDigits(DigitsMLP):
    """A trial whose training step raises on one rank from optimizer step ``fail_at`` on (a rank's own failure)."""

    def __init__(self, *, fail_on_rank: int, fail_at: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fail_on_rank = fail_on_rank
        self.fail_at = fail_at

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.trainer.global_rank == self.fail_on_rank and self.trainer.global_step >= self.fail_at:
            raise RuntimeError(f"trial failed on rank {self.fail_on_rank} at step {self.trainer.global_step}")
        return super().training_step(batch, batch_idx)


class NanOnOneRank(DigitsMLP):
    """A trial whose loss is NaN on one rank at one optimizer step (lr 0.3 only): its row is bad there alone."""

    def __init__(self, *, nan_on_rank: int, nan_at: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.nan_on_rank = nan_on_rank
        self.nan_at = nan_at

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        trainer = self.trainer
        if self.hparams["lr"] == 0.3 and trainer.global_rank == self.nan_on_rank and trainer.global_step == self.nan_at:
            return loss * float("nan")
        return loss
