"""On the CPU, read back every step (the default there), a step reads instead of masking: the same values, fewer ops.

The masked step (what runs on an accelerator, or with ``divergence_check_every`` set) keeps a diverged row as it
was without knowing on the host which it is. Where a read waits for nothing, the loss sum and the update read
whether any row is bad, and a step with none leaves the masking out. Each case is fitted both ways in a real
Trainer and compared bitwise; the ops the read step leaves out are counted.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lightning_hydro import FusedLightningModule
from tests.fused.step.test_lazy_divergence import NanFromStep
from tests.helpers import fit_digits, make_trainer, max_state_difference, seeded


class MaskingOps(TorchDispatchMode):
    """Counts the masking ops dispatched while active, forward and backward: ``masked_fill_`` and ``where``."""

    def __init__(self) -> None:
        super().__init__()
        self.fills = self.wheres = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.masked_fill_.Scalar:
            self.fills += 1
        elif func.overloadpacket is torch.ops.aten.where:
            self.wheres += 1
        return func(*args, **(kwargs or {}))


class CountMaskingPerBatch(L.Callback):
    """(masked_fill_, where, optimizer steps) of each training batch from the fifth on.

    Before: fusion's check, the momentum buffers' start, and the first clean step's store of the factors.
    """

    def __init__(self) -> None:
        self.mode = MaskingOps()
        self.counts: list[tuple[int, int, int]] = []
        self._start = (0, 0, 0)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, i: int) -> None:
        if i == 4:
            self.mode.__enter__()
        self._start = (self.mode.fills, self.mode.wheres, trainer.global_step)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if self.mode.fills or self.mode.wheres:
            fills, wheres, steps = self._start
            self.counts.append((self.mode.fills - fills, self.mode.wheres - wheres, trainer.global_step - steps))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.mode.__exit__(None, None, None)


def _fit(
    optimizer: str, check_every: int | None, nan_from: list[float], steps: int = 12, **trainer: Any
) -> tuple[FusedLightningModule, CountMaskingPerBatch]:
    trials = [
        seeded(lambda s=s, lr=lr: NanFromStep(s, hidden_dim=16, lr=lr, optimizer=optimizer), [i])[0]
        for i, (s, lr) in enumerate(zip(nan_from, [0.01, 0.03, 0.1, 0.3]))
    ]
    fused = FusedLightningModule(
        trials, backend="vmap", summary=False, optimizer_path="fused", divergence_check_every=check_every
    )
    counter = CountMaskingPerBatch()
    fit_digits(make_trainer(max_steps=steps, limit_val_batches=0, callbacks=[counter], **trainer), fused)
    return fused, counter


def _same_trials(read: FusedLightningModule, masked: FusedLightningModule, trial_ids: list[int]) -> None:
    for tid in trial_ids:
        mine, theirs = read.unfuse(tid).state_dict(), masked.unfuse(tid).state_dict()
        assert mine.keys() == theirs.keys()
        for name in mine:
            assert torch.equal(mine[name], theirs[name]), (tid, name)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("trainer", [{}, {"gradient_clip_val": 0.5}, {"accumulate_grad_batches": 2}])
def test_a_step_that_reads_trains_bitwise_as_the_masked_step(optimizer, trainer):
    inf = float("inf")
    read, read_ops = _fit(optimizer, None, [inf] * 4, **trainer)  # the CPU's default: read back every step
    masked, masked_ops = _fit(optimizer, 1000, [inf] * 4, **trainer)  # read back at steps 1, 2, 4, 8 only
    _same_trials(read, masked, [0, 1, 2, 3])
    assert len(read_ops.counts) == len(masked_ops.counts) >= 8
    for (read_fills, read_wheres, stepped), (fills, wheres, _) in zip(read_ops.counts, masked_ops.counts):
        # left out: a masked_fill_ per gradient (6), the loss sum's where and its backward, and at an optimizer
        # step the factors' table (SGD; Adam writes its bias corrections each step and keeps that where)
        assert (read_fills, fills) == (0, 6 * stepped)
        assert wheres - read_wheres == 2 + (stepped if optimizer == "sgd" else 0)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_diverging_trial_is_masked_at_the_step_it_goes_bad_and_its_neighbours_are_untouched(optimizer):
    inf = float("inf")
    read, read_ops = _fit(optimizer, None, [inf, 5, inf, inf])  # trial 1's loss is NaN from step 5 on
    assert read.results[1]["status"] == "diverged"
    assert read.results[1]["steps"] == 5
    assert read.results[1]["reason"] == "non-finite loss"
    assert read.trial_ids == [0, 2, 3]
    # the bad step (the 6th batch) took the masked way; the others did not. After it the group of 3 has a new
    # update, whose first SGD step starts the momentum buffers it did not import (none: 2 fills of empty masks)
    fresh = 2 if optimizer == "sgd" else 0
    assert [fills for fills, _, _ in read_ops.counts] == [0, 6, fresh] + [0] * (len(read_ops.counts) - 3)
    masked = _fit(optimizer, 1000, [inf, 5, inf, inf])[0]  # trial 1 skipped, masked, until step 8's read-back
    assert [masked.results[1][k] for k in ("status", "reason", "steps")] == ["diverged", "non-finite loss", 5]
    _same_trials(read, masked, [1])  # its last finite weights, kept exactly both ways
    clean = _fit(optimizer, None, [inf] * 4)[0]
    for tid in (0, 2, 3):  # a group of 3 from step 6 on: its batched kernels may round otherwise than 4 rows'
        assert max_state_difference(read.unfuse(tid), clean.unfuse(tid)) <= 1e-6
