"""Buffers that a trial's own code changes, in place or by reassignment, end up in each trial as if it trained alone.

A buffer of a fused trial is a view of its row of the group's stacked buffer. Two ways user code changes one: in
place (``self.seen += 1``; BatchNorm's statistics), which reaches the row by itself; and by reassignment
(``self.count = self.count + 1``; a norm layer of one's own writing ``self.running = 0.9 * self.running + ...``),
which makes the module hold a new tensor (and leaves the old one to a backward pass that saved it). Before: a
reassignment in a step was lost on every backend (the row kept its first value: a count of 0 after 12 steps, alone
12), one in a hook too, and a change in place was counted once more by each run of vmap's and hfta's first-batch
check (15 after 12 steps).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_hydro import FusedLightningModule
from lightning_hydro.backends import FusionError
from lightning_hydro.demos import DigitsMLP
from tests.helpers import (
    StopTrialAt,
    fit_digits,
    make_trainer,
    max_state_difference,
    seeded,
    train_fused,
    train_separately,
)


class RunningCenter(nn.Module):
    """Subtracts a running mean of its input that it keeps by reassigning its buffer (a norm layer of one's own)."""

    def __init__(self, features: int, momentum: float = 0.1) -> None:
        super().__init__()
        self.momentum = momentum
        self.register_buffer("running", torch.zeros(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                self.running = (1 - self.momentum) * self.running + self.momentum * x.mean(0)
        return x - self.running


class DecayingGain(nn.Module):
    """Scales by a gain it then decays by reassigning: the step's backward needs the gain's value from before."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("gain", torch.tensor(1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x * self.gain
        if self.training:
            self.gain = self.gain * 0.9
        return out


class CountingMLP(DigitsMLP):
    """Keeps counts and averages in buffers, changed in place and by reassignment, in its step and its hooks."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(hidden_dim=16, **kwargs)
        self.center = RunningCenter(64)
        self.decay = DecayingGain()
        self.register_buffer("seen", torch.tensor(0))  # in place
        self.register_buffer("steps", torch.tensor(0))  # reassigned in the step
        self.register_buffer("loss_ema", torch.tensor(0.0))  # reassigned in the step, logged
        self.register_buffer("batch_ends", torch.tensor(0))  # reassigned in a batch hook
        self.register_buffer("epochs", torch.tensor(0.0))  # reassigned in an epoch hook

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.decay(self.body(self.center(x))))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.seen += x.shape[0]
        self.steps = self.steps + 1
        with torch.no_grad():
            self.loss_ema = 0.9 * self.loss_ema + 0.1 * loss
        self.log("loss_ema", self.loss_ema, on_step=False, on_epoch=True)
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.batch_ends = self.batch_ends + 1

    def on_train_epoch_end(self) -> None:
        self.epochs = self.epochs + self.loss_ema


LRS = (0.05, 0.2, 0.5)
FIT: dict[str, Any] = dict(max_epochs=2, limit_train_batches=6, limit_val_batches=2)


def trials() -> list[CountingMLP]:
    lrs = iter(LRS)
    return seeded(lambda: CountingMLP(lr=next(lrs)), range(len(LRS)))


@pytest.mark.parametrize("backend", ["vmap", "hfta", "loop", "auto"])
def test_buffers_changed_in_place_or_reassigned_in_steps_and_hooks_equal_alone(backend: str) -> None:
    modules = trials()
    alone = train_separately(modules, fit_digits, **FIT)
    fused = train_fused(modules, fit_digits, fused_kwargs=dict(backend=backend), **FIT)
    for trial_id, trained in enumerate(alone):
        mine = fused.unfuse(trial_id)
        assert (int(mine.seen), int(mine.steps), int(mine.batch_ends)) == (12 * 64, 12, 12)
        assert max_state_difference(mine, trained) <= 1e-5, trial_id
        assert max_state_difference(fused.trial_module(trial_id), trained) <= 1e-5  # the live module's views too
        logged = float(fused.trainer.callback_metrics[f"loss_ema/trial_{trial_id}"])
        assert logged == pytest.approx(float(trained.trainer.callback_metrics["loss_ema"]), rel=1e-5)


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_buffers_of_the_trials_that_stay_equal_alone_when_one_is_stopped(backend: str) -> None:
    modules = trials()
    alone = train_separately(modules, fit_digits, **FIT)
    fused = train_fused(modules, fit_digits, fused_kwargs=dict(backend=backend), callbacks=[StopTrialAt(4)], **FIT)
    for trial_id in (0, 2):
        assert max_state_difference(fused.unfuse(trial_id), alone[trial_id]) <= 1e-5


class Widening(DigitsMLP):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(hidden_dim=16, **kwargs)
        self.register_buffer("history", torch.zeros(1))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.history = torch.cat([self.history, self.history[-1:] + 1])  # grows: a row cannot hold it
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("backend", ["vmap", "loop"])
def test_a_buffer_reassigned_with_another_shape_is_refused_by_name(backend: str) -> None:
    fused = FusedLightningModule([Widening(lr=lr) for lr in LRS], backend=backend, summary=False)
    with pytest.raises(FusionError, match=r"Widening.training_step reassigns the buffer 'history' with shape \(2,\)"):
        fit_digits(make_trainer(max_steps=2, limit_val_batches=0), fused)


class ManualCounting(DigitsMLP):
    """Manual optimization (its steps run on the trial's own module) that counts its steps in a reassigned buffer."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(hidden_dim=16, **kwargs)
        self.automatic_optimization = False
        self.register_buffer("steps", torch.tensor(0))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        opt = self.optimizers()
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        self.steps = self.steps + 1
        return loss


class GroupState(L.Callback):
    """The group's state of the trials' step counts after each batch (what a checkpoint then would hold)."""

    def __init__(self) -> None:
        self.counts: list[list[int]] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, *args: Any) -> None:
        state = pl_module.state_dict()
        self.counts.append(state[next(k for k in state if k.endswith("steps"))].tolist())


def test_a_buffer_a_manual_step_reassigns_is_in_the_group_after_each_step() -> None:
    # manual optimization runs each trial's step on its own module; before, the group's buffers caught up only at
    # the epoch's end (a checkpoint or a slot change within the epoch saw the old values)
    lrs = iter(LRS)
    modules = seeded(lambda: ManualCounting(lr=next(lrs)), range(len(LRS)))
    seen = GroupState()
    fused = train_fused(
        modules, fit_digits, fused_kwargs=dict(backend="loop"), callbacks=[seen], max_steps=4, limit_val_batches=0
    )
    assert seen.counts == [[step] * len(LRS) for step in (1, 2, 3, 4)]
    assert [int(fused.unfuse(trial_id).steps) for trial_id in range(len(LRS))] == [4] * len(LRS)
