"""Host syncs per training step: none in the steady state of vmap and hfta with the fused optimizer path.

A host sync is a device-to-host read of a tensor's value (``.item()``, ``bool(tensor)``, ``.tolist()``): on a GPU
the CPU then waits for every queued kernel. ``.item()`` and ``bool(tensor)`` dispatch ``aten._local_scalar_dense``,
counted by a ``TorchDispatchMode``; on the CPU ``.tolist()`` dispatches nothing, so a ``TorchFunctionMode`` also
counts every value read at the Python level (``tolist``, ``item``, ``__bool__``, ``__float__``, ...). The latter
also sees reads of tensors that live on the host by design (Adam's per-row step counts, kept on the CPU as
torch's own Adam keeps ``step``), so it is asserted where the optimizer keeps no host-side state (SGD).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsMLP
from tests.helpers import fit_digits, make_trainer, seeded

_SCALAR_READ = torch.ops.aten._local_scalar_dense.default


class ScalarReads(TorchDispatchMode):
    """Counts ``aten._local_scalar_dense`` calls while active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is _SCALAR_READ:
            self.count += 1
        return func(*args, **(kwargs or {}))


_VALUE_READS = {"tolist", "item", "__bool__", "__float__", "__int__", "__index__", "numpy"}


class ValueReads(TorchFunctionMode):
    """Counts reads of a tensor's value into Python while active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if getattr(func, "__name__", "") in _VALUE_READS:
            self.count += 1
        return func(*args, **(kwargs or {}))


class CountPerStep(L.Callback):
    """The reads of each training batch, from one batch's start to the next's (module hooks included)."""

    def __init__(self) -> None:
        self.scalar, self.values = ScalarReads(), ValueReads()
        self.marks: list[tuple[int, int]] = []

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.values.__enter__()
        self.scalar.__enter__()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, i: int) -> None:
        self.marks.append((self.scalar.count, self.values.count))

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.marks.append((self.scalar.count, self.values.count))
        self.scalar.__exit__(None, None, None)
        self.values.__exit__(None, None, None)

    def per_step(self, which: int) -> list[int]:
        """Per batch: ``aten._local_scalar_dense`` calls (which=0) or Python-level value reads (which=1)."""
        return [b[which] - a[which] for a, b in zip(self.marks, self.marks[1:])]


def _count(
    backend: str, optimizer: str, *, steps: int = 20, check_every: int = 16, **trainer: Any
) -> tuple[list[int], list[int]]:
    trials = [
        seeded(lambda lr=lr: DigitsMLP(hidden_dim=32, lr=lr, optimizer=optimizer), [i])[0]
        for i, lr in enumerate([0.01, 0.03, 0.1, 0.3])
    ]
    fused = FusedLightningModule(
        trials, backend=backend, summary=False, optimizer_path="fused", divergence_check_every=check_every
    )
    counter = CountPerStep()
    fit_digits(make_trainer(max_steps=steps, limit_val_batches=0, callbacks=[counter], **trainer), fused)
    assert fused.results[0]["steps"] == steps  # the reads that did happen counted every step
    return counter.per_step(0), counter.per_step(1)


def _read_back_steps(steps: int, check_every: int) -> set[int]:
    """0-based batch indices whose end reads the group's health back: optimizer steps 1, 2, 4, ..., then every N."""
    ramp = {n for n in range(1, check_every + 1) if n & (n - 1) == 0} | {check_every}
    return {n - 1 for n in range(1, steps + 1) if n in ramp or n % check_every == 0}


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_steady_state_step_reads_nothing_back_on_the_fused_path(backend, optimizer):
    scalar, values = _count(backend, optimizer)
    reads = _read_back_steps(20, 16)
    steady = [i for i in range(1, len(scalar) - 1) if i not in reads]  # batch 0 verifies fusion
    assert len(steady) >= 10
    assert [scalar[i] for i in steady] == [0] * len(steady), scalar
    if optimizer == "sgd":  # no host-side optimizer state: no value read at all
        assert [values[i] for i in steady] == [0] * len(steady), values
    assert all(values[i] >= 1 for i in reads if 0 < i < len(values) - 1)  # the read-backs are seen


def test_gradient_clipping_and_accumulation_stay_on_the_device():
    scalar, values = _count("vmap", "sgd", gradient_clip_val=0.5, accumulate_grad_batches=2, steps=10)
    # batch i ends optimizer step (i + 1) // 2 on odd i: only steps 1, 2, 4, 8 read back
    reads = {2 * s - 1 for s in (1, 2, 4, 8)}
    steady = [i for i in range(1, len(scalar) - 1) if i not in reads]
    assert len(steady) >= 8
    assert [scalar[i] + values[i] for i in steady] == [0] * len(steady), (scalar, values)


def test_the_universal_path_reads_back_once_per_step():
    """Each trial's own optimizer steps (or not) on the host: which trials to step is read back every step."""
    trials = [seeded(lambda: DigitsMLP(hidden_dim=32, lr=0.1), [i])[0] for i in range(4)]
    fused = FusedLightningModule(trials, backend="vmap", summary=False, optimizer_path="universal")
    counter = CountPerStep()
    fit_digits(make_trainer(max_steps=12, limit_val_batches=0, callbacks=[counter]), fused)
    per_step = counter.per_step(1)[1:-1]
    assert per_step
    assert all(count >= 1 for count in per_step), per_step
