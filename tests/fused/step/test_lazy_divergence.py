"""A divergence kept on the device is read back before decisions: validation, epoch end, checkpoints."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsMLP
from tests.helpers import fit_digits, make_trainer, seeded


class NanFromStep(DigitsMLP):
    """Its loss is NaN from optimizer step ``start`` on (a buffer: per trial under vmap)."""

    def __init__(self, start: float = float("inf"), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.register_buffer("start", torch.tensor(float(start)))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        broken = self.start <= self.global_step
        return loss * torch.where(broken, torch.tensor(float("nan")), torch.tensor(1.0))


class SeenAtValidation(L.Callback):
    def __init__(self) -> None:
        self.seen: list[tuple[int, list[int]]] = []

    def on_validation_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        self.seen.append((trainer.global_step, list(pl_module.trial_ids)))


def test_validation_in_the_middle_of_an_epoch_sees_a_divergence_not_yet_read_back():
    # trial 1 goes bad at step 5; reads are scheduled at steps 1, 2, 4, 8, ...: validation after 6 batches comes first
    trials = [seeded(lambda s=s: NanFromStep(s, hidden_dim=8), [i])[0] for i, s in enumerate([float("inf"), 4])]
    fused = FusedLightningModule(trials, backend="vmap", summary=False, divergence_check_every=64)
    probe = SeenAtValidation()
    fit_digits(make_trainer(max_steps=7, val_check_interval=6, limit_val_batches=1, callbacks=[probe]), fused)
    assert probe.seen[0] == (6, [0])
    assert fused.results[1]["status"] == "diverged"
    assert fused.results[1]["steps"] == 4
    assert fused.results[0]["steps"] == 7
