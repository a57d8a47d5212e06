"""A slot change within a gradient-accumulation window: the trials that stay step on the whole window.

With ``accumulate_grad_batches=2`` Lightning steps the optimizer after every second batch; the batches in between
add to the stacked gradients. A trial stopped (ASHA, a divergence) after the window's first batch shrank the
group and dropped those gradients: every other trial then stepped on the window's second batch alone, silently
otherwise than alone (a relative difference of 1e-2 in the weights after 4 steps). Each case here is checked
against every trial trained alone.
"""

from __future__ import annotations

import copy
from typing import Any

import lightning as L
import pytest
import torch

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsMLP
from tests.fused.group.test_width_padding import cnn_trials
from tests.fused.step.manual_modules import ManualMLP
from tests.helpers import fit_digits, make_trainer, max_state_difference, mixed_optimizer_mlps

ACCUMULATE = dict(max_steps=4, limit_val_batches=0, accumulate_grad_batches=2)


class StopWithinTheWindow(L.Callback):
    """Stops trial 1 after the third batch: the first of the second accumulation window (and, if asked, refills)."""

    def __init__(self, at: int = 2, newcomer: L.LightningModule | None = None) -> None:
        self.at, self.newcomer = at, newcomer

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.at and 1 in pl_module.trial_ids:
            pl_module.stop_trial(1, "stopped within an accumulation window")
            if self.newcomer is not None:
                pl_module.add_trial(copy.deepcopy(self.newcomer), trial_id=9)


def _alone(trials: list[L.LightningModule], **trainer_kwargs: Any) -> list[L.LightningModule]:
    separate = [copy.deepcopy(t) for t in trials]
    for module in separate:
        fit_digits(make_trainer(**trainer_kwargs), module)
    return separate


@pytest.mark.parametrize("backend", ["vmap", "hfta", "loop"])
def test_a_trial_stopped_within_an_accumulation_window_leaves_the_others_as_alone(backend):
    trials = mixed_optimizer_mlps(hidden_dim=16)  # SGD with momentum, SGD with weight decay, Adam, AdamW
    alone = _alone(trials, **ACCUMULATE)
    stopped = _alone(trials[1:2], **{**ACCUMULATE, "max_steps": 1})[0]  # one full window, then stopped
    fused = FusedLightningModule(trials, backend=backend, summary=False)
    fit_digits(make_trainer(**ACCUMULATE, callbacks=[StopWithinTheWindow()]), fused)
    for tid in (0, 2, 3):
        assert max_state_difference(fused.unfuse(tid), alone[tid]) <= 1e-5, tid
    assert max_state_difference(fused.unfuse(1), stopped) <= 1e-5


def test_a_newcomer_within_an_accumulation_window_leaves_the_others_as_alone():
    # the newcomer's row starts at a zero gradient: its first step has the window's later batches only
    trials = [DigitsMLP(hidden_dim=16, lr=lr, momentum=0.9) for lr in (0.05, 0.1, 0.02)]
    torch.manual_seed(9)
    newcomer = DigitsMLP(hidden_dim=16, lr=0.07, momentum=0.9)
    alone = _alone(trials, **ACCUMULATE)
    fused = FusedLightningModule(trials, backend="vmap", summary=False)
    fit_digits(make_trainer(**ACCUMULATE, callbacks=[StopWithinTheWindow(newcomer=newcomer)]), fused)
    assert fused.trial_ids == [0, 2, 9]
    for tid in (0, 2):
        assert max_state_difference(fused.unfuse(tid), alone[tid]) <= 1e-5, tid
    assert max_state_difference(fused.unfuse(9), newcomer) > 1e-3  # it trained


def test_the_widest_trial_stopped_within_an_accumulation_window_leaves_the_narrower_ones_as_alone():
    # trials of 4, 8 and 6 channels zero-padded to 8: the stop cuts the group (and its gradients) to 6
    trials = cnn_trials()
    alone = _alone(trials, **{**ACCUMULATE, "max_steps": 3})
    fused = FusedLightningModule(trials, backend="vmap", pad_widths=True, summary=False)
    fit_digits(make_trainer(**{**ACCUMULATE, "max_steps": 3}, callbacks=[StopWithinTheWindow()]), fused)
    assert fused.stacked.get_parameter("head__weight").shape == (2, 10, 48)
    for tid in (0, 2):
        assert max_state_difference(fused.unfuse(tid), alone[tid]) <= 1e-4, tid


class RMSpropMLP(DigitsMLP):
    """An optimizer the fused update does not implement: every trial steps its own (the universal path)."""

    def configure_optimizers(self) -> Any:
        return torch.optim.RMSprop(self.parameters(), lr=self.hparams["lr"], momentum=0.5)


def test_on_the_universal_optimizer_path_a_stop_within_a_window_leaves_the_others_as_alone():
    trials = [RMSpropMLP(hidden_dim=16, lr=lr) for lr in (1e-3, 3e-3, 5e-4)]
    alone = _alone(trials, **ACCUMULATE)
    fused = FusedLightningModule(trials, backend="vmap", summary=False)
    fit_digits(make_trainer(**ACCUMULATE, callbacks=[StopWithinTheWindow()]), fused)
    assert fused._optimizers.optimizer.fused is None  # (the universal path indeed)
    for tid in (0, 2):
        assert max_state_difference(fused.unfuse(tid), alone[tid]) <= 1e-5, tid


def test_under_manual_optimization_a_stop_within_the_steps_own_window_leaves_the_others_as_alone():
    # the manual-optimization page's accumulation: manual_backward(loss / 2), opt.step() every second batch
    trials = [ManualMLP(lr=lr, clip=None) for lr in (0.1, 0.05, 0.2)]
    limits = dict(max_epochs=1, limit_train_batches=6, limit_val_batches=0)
    alone = _alone(trials, **limits)
    fused = FusedLightningModule(trials, summary=False)
    fit_digits(make_trainer(**limits, callbacks=[StopWithinTheWindow()]), fused)
    for tid in (0, 2):
        assert max_state_difference(fused.unfuse(tid), alone[tid]) <= 1e-5, tid
