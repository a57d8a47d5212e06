"""A trial whose ``training_step`` returns None for a batch: Lightning skips that trial's backward and update.

Lightning documents returning None from ``training_step`` to skip a batch (a loss spike, a bad batch). When the
trials differ in which batches they skip (a data-dependent condition, a per-trial setting), only the loop runs
them (vmap and hfta refuse the differing path). Before, the loop stacked the rows' outputs from the first row's
kind: a None in row 0 made the whole group skip the step, silently (the other trials 0.47 and 1.0 relative away
from alone after 6 steps), and a None in a later row crashed ("expected Tensor as element 1"). Now the other
trials' backward gives the skipping trial's row zeros, and the group optimizer steps that trial as alone with no
gradient, which torch's optimizers pass over (no momentum, no weight decay, no Adam step): every trial here is
bitwise equal to itself trained alone, with and without gradient accumulation.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsMLP
from tests.helpers import fit_digits, make_trainer, max_state_difference, seeded, train_fused, train_separately


class SkippingMLP(DigitsMLP):
    """Returns None for the batches it is told to skip, or when its loss is above its threshold."""

    def __init__(self, skip: tuple[int, ...] = (), threshold: float = 1e9, **kwargs: Any) -> None:
        super().__init__(hidden_dim=16, **kwargs)
        self.save_hyperparameters()
        self.backward_hooks = 0  # how often Lightning ran this trial's backward hooks
        self.updates_without_gradient = 0  # optimizer steps that found no gradient on this trial

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor | None:
        loss = super().training_step(batch, batch_idx)
        if batch_idx in self.hparams["skip"] or loss > self.hparams["threshold"]:
            return None
        return loss

    def on_after_backward(self) -> None:
        self.backward_hooks += 1

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        self.updates_without_gradient += int(all(p.grad is None for p in self.parameters()))


def trials() -> list[nn.Module]:
    configs = iter(
        [
            dict(skip=(0, 2, 3), lr=0.05, momentum=0.9, weight_decay=1e-2),  # momentum and decay: zeros would move it
            dict(lr=0.2, momentum=0.0),
            dict(threshold=2.0, lr=3e-3, optimizer="adam"),  # skips the batches whose loss is above 2
            dict(skip=(1,), lr=3e-3, optimizer="adamw", weight_decay=0.05),
        ]
    )
    return seeded(lambda: SkippingMLP(**next(configs)), range(4))


@pytest.mark.parametrize("accumulate", [1, 2])
@pytest.mark.parametrize(("backend", "optimizer_path"), [("loop", "auto"), ("loop", "universal"), ("auto", "auto")])
def test_trials_that_skip_different_batches_each_train_as_alone(backend: str, optimizer_path: str, accumulate: int):
    modules = trials()
    kwargs: dict[str, Any] = dict(max_steps=4, limit_val_batches=0, accumulate_grad_batches=accumulate)
    alone = train_separately(modules, fit_digits, **kwargs)
    fused = train_fused(
        modules, fit_digits, fused_kwargs=dict(backend=backend, optimizer_path=optimizer_path), **kwargs
    )
    for trial_id, trained in enumerate(alone):
        fused_trial = fused.trial_module(trial_id)
        assert max_state_difference(fused.unfuse(trial_id), trained) == 0.0, trial_id
        assert fused_trial.backward_hooks == trained.backward_hooks, trial_id
        assert fused_trial.updates_without_gradient == trained.updates_without_gradient, trial_id
    assert alone[0].updates_without_gradient > 0  # the cases happened: a step with no gradient at all
    if accumulate == 2:  # trial 3 skips batch 1 only: its first step has batch 0's gradient
        assert alone[3].updates_without_gradient == 0


@pytest.mark.parametrize("accumulate", [1, 2])
def test_on_the_fused_update_a_skipping_trial_is_left_as_alone(accumulate: int):
    configs = iter([dict(skip=(0, 2, 3), lr=0.05, weight_decay=1e-2), dict(lr=0.2), dict(skip=(1,), lr=0.1)])
    modules = seeded(lambda: SkippingMLP(momentum=0.9, **next(configs)), range(3))
    kwargs: dict[str, Any] = dict(max_steps=4, limit_val_batches=0, accumulate_grad_batches=accumulate)
    alone = train_separately(modules, fit_digits, **kwargs)
    fused = train_fused(modules, fit_digits, fused_kwargs=dict(backend="loop", optimizer_path="fused"), **kwargs)
    for trial_id, trained in enumerate(alone):
        assert max_state_difference(fused.unfuse(trial_id), trained) == 0.0, trial_id
        assert fused.results[trial_id]["status"] == "completed"  # not counted as diverged


def test_under_several_processes_a_trial_that_returns_none_is_refused_as_lightning_refuses_it_alone(monkeypatch):
    # Lightning raises "Skipping the training_step by returning None in distributed training is not supported" for
    # one module; a group would otherwise train such trials under DDP without a word (the world size is faked here:
    # the check comes before any collective)

    fused = FusedLightningModule(trials()[:2], backend="loop", summary=False)

    def two_processes(trainer: Any) -> None:
        fused._ranks.world_size = 2

    monkeypatch.setattr(fused._ranks, "setup", two_processes)
    with pytest.raises(RuntimeError, match=r"returned None for trials \[0\] under 2 processes"):
        fit_digits(make_trainer(max_steps=1, limit_val_batches=0), fused)
