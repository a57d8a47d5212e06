"""Host syncs and host-to-device copies per training step: none in the steady state of the fused optimizer path.

A host sync is a device-to-host read of a tensor's value (``.item()``, ``bool(tensor)``, ``.tolist()``): on a GPU
the CPU then waits for every queued kernel. ``.item()`` and ``bool(tensor)`` dispatch ``aten._local_scalar_dense``,
counted by a ``TorchDispatchMode``; on the CPU ``.tolist()`` dispatches nothing, so a ``TorchFunctionMode`` also
counts every value read at the Python level (``tolist``, ``item``, ``__bool__``, ``__float__``, ...).

A copy from the host waits for the GPU too: ``torch.tensor(values, device=cuda)`` and ``.to(cuda)`` from pageable
memory synchronise (CUDA's sync debug mode reports them); only a ``non_blocking`` copy from pinned memory does not.
On the CPU every device is the host, so :class:`HostCopies` counts what would be such a copy on a GPU: tensors
built from Python values (``torch.tensor``, ``torch.full``, ...) and moves (``.to(device)``, ``.cuda()``), each as
blocking or not. Lightning's own transfer of the batch is left out (:class:`CountedDigits`). The same cases run on
a GPU under ``torch.cuda.set_sync_debug_mode("error")`` in the ``gpu``-marked test at the end.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import lightning as L
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from lightning_hydro import FusedLightningModule
from lightning_hydro.demos import DigitsDataModule, DigitsMLP
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


# tensors made from Python values (host memory), and moves of a tensor to a device
_BUILDERS = {
    torch.tensor,
    torch.as_tensor,
    torch.asarray,
    torch.scalar_tensor,
    torch.full,
    torch.from_numpy,
    torch.Tensor.new_tensor,
    torch.Tensor.new_full,
}
_MOVES = {torch.Tensor.to, torch.Tensor.cuda}


def _names_a_device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if kwargs.get("device") is not None:
        return True
    return any(isinstance(a, (str, torch.device, torch.Tensor)) for a in args[1:])


class HostCopies(TorchFunctionMode):
    """Counts what would copy from the host to a GPU inside a step, and whether the CPU would wait for it.

    ``blocking``: a tensor built from Python values on a device (``torch.tensor(v, device=...)``) or moved without
    ``non_blocking=True``: on a GPU each waits for the device. ``built``: tensors built from Python values on the
    host; ``moved``: ``non_blocking`` moves (from pinned memory on a GPU: no wait, but a copy all the same).
    """

    def __init__(self) -> None:
        super().__init__()
        self.blocking = self.built = self.moved = 0
        self.paused = False

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if not self.paused:
            if func in _BUILDERS:
                if kwargs.get("device") is not None:
                    self.blocking += 1
                else:
                    self.built += 1
            elif func in _MOVES and (func is torch.Tensor.cuda or _names_a_device(args, kwargs)):
                if kwargs.get("non_blocking"):
                    self.moved += 1
                else:
                    self.blocking += 1
        return func(*args, **kwargs)

    @contextmanager
    def pause(self) -> Iterator[None]:
        """Not counted: what Lightning does outside the step (the batch's transfer)."""
        self.paused = True
        try:
            yield
        finally:
            self.paused = False


class CountPerStep(L.Callback):
    """The counts of each training batch, from one batch's start to the next's (module hooks included)."""

    def __init__(self) -> None:
        self.scalar, self.values, self.copies = ScalarReads(), ValueReads(), HostCopies()
        self.marks: list[tuple[int, ...]] = []

    def _mark(self) -> None:
        c = self.copies
        self.marks.append((self.scalar.count, self.values.count, c.blocking, c.built, c.moved))

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.copies.__enter__()
        self.values.__enter__()
        self.scalar.__enter__()

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, i: int) -> None:
        self._mark()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._mark()
        self.scalar.__exit__(None, None, None)
        self.values.__exit__(None, None, None)
        self.copies.__exit__(None, None, None)

    def per_step(self, which: int) -> list[int]:
        """Per batch: 0 scalar reads, 1 value reads, 2 blocking copies, 3 host tensors built, 4 non-blocking moves."""
        return [b[which] - a[which] for a, b in zip(self.marks, self.marks[1:])]


class CountedDigits(DigitsDataModule):
    """The digits data, its batch transfer (Lightning's, outside the fused step) left out of the counts."""

    def __init__(self, counter: CountPerStep) -> None:
        super().__init__()
        self.counter = counter

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        with self.counter.copies.pause():
            return super().transfer_batch_to_device(batch, device, dataloader_idx)


class ScheduledEveryBatch(DigitsMLP):
    """Lightning's docs' shape: OneCycleLR stepped every batch (it changes lr, and momentum or betas, each step)."""

    def configure_optimizers(self) -> Any:
        optimizer = super().configure_optimizers()
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=self.hparams["lr"], total_steps=100)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _count(
    backend: str,
    optimizer: str,
    *,
    steps: int = 20,
    check_every: int = 16,
    scheduled: bool = False,
    **trainer: Any,
) -> CountPerStep:
    cls = ScheduledEveryBatch if scheduled else DigitsMLP
    trials = [
        seeded(lambda lr=lr: cls(hidden_dim=32, lr=lr, optimizer=optimizer), [i])[0]
        for i, lr in enumerate([0.01, 0.03, 0.1, 0.3])
    ]
    fused = FusedLightningModule(
        trials, backend=backend, summary=False, optimizer_path="fused", divergence_check_every=check_every
    )
    counter = CountPerStep()
    make_trainer(max_steps=steps, limit_val_batches=0, callbacks=[counter], **trainer).fit(
        fused, datamodule=CountedDigits(counter)
    )
    assert fused.results[0]["steps"] == steps  # the reads that did happen counted every step
    return counter


def _read_back_steps(steps: int, check_every: int) -> set[int]:
    """0-based batch indices whose end reads the group's health back: optimizer steps 1, 2, 4, ..., then every N."""
    ramp = {n for n in range(1, check_every + 1) if n & (n - 1) == 0} | {check_every}
    return {n - 1 for n in range(1, steps + 1) if n in ramp or n % check_every == 0}


def _steady(counter: CountPerStep, reads: set[int]) -> list[int]:
    """Batches after the first (it verifies fusion and starts the state) that end without a read-back."""
    batches = len(counter.per_step(0))
    return [i for i in range(1, batches - 1) if i not in reads]


@pytest.mark.parametrize("backend", ["vmap", "hfta"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_steady_state_step_reads_nothing_back_on_the_fused_path(backend, optimizer):
    counter = _count(backend, optimizer)
    scalar, values = counter.per_step(0), counter.per_step(1)
    reads = _read_back_steps(20, 16)
    steady = _steady(counter, reads)
    assert len(steady) >= 10
    assert [scalar[i] for i in steady] == [0] * len(steady), scalar
    assert [values[i] for i in steady] == [0] * len(steady), values  # no host-side optimizer state either
    assert all(values[i] >= 1 for i in reads if 0 < i < len(values) - 1)  # the read-backs are seen


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("scheduled", [False, True], ids=["fixed", "scheduled"])
def test_the_steady_step_copies_nothing_from_the_host_unless_a_hyperparameter_changed(optimizer, scheduled):
    counter = _count("vmap", optimizer, scheduled=scheduled, gradient_clip_val=0.5)
    scalar, values, blocking, built, moved = (counter.per_step(k) for k in range(5))
    steady = _steady(counter, _read_back_steps(20, 16))
    assert len(steady) >= 10
    assert [scalar[i] + values[i] + blocking[i] for i in steady] == [0] * len(steady), (scalar, values, blocking)
    if scheduled:  # each step's new lr (and momentum or betas): one host tensor, one non-blocking copy
        assert [(built[i], moved[i]) for i in steady] == [(1, 1)] * len(steady), (built, moved)
    else:
        assert [built[i] + moved[i] for i in steady] == [0] * len(steady), (built, moved)


def test_the_counter_sees_a_per_step_copy_to_the_device():
    """What the fused update did before its factors lived on the device: a tensor built with a device each step."""
    copies = HostCopies()
    with copies:
        torch.tensor([0.1, 0.2], device="cpu")
        torch.zeros(2).to("cpu")
        torch.zeros(2).to(torch.device("cpu"), non_blocking=True)
        torch.zeros(2).to(torch.float64)  # a cast, not a move
        torch.tensor([0.1, 0.2])
    assert (copies.blocking, copies.built, copies.moved) == (2, 1, 1)


def test_gradient_clipping_and_accumulation_stay_on_the_device():
    counter = _count("vmap", "sgd", gradient_clip_val=0.5, accumulate_grad_batches=2, steps=10)
    scalar, values, blocking, built, moved = (counter.per_step(k) for k in range(5))
    # batch i ends optimizer step (i + 1) // 2 on odd i: only steps 1, 2, 4, 8 read back
    reads = {2 * s - 1 for s in (1, 2, 4, 8)}
    steady = _steady(counter, reads)
    assert len(steady) >= 8
    counts = [scalar[i] + values[i] + blocking[i] + built[i] + moved[i] for i in steady]
    assert counts == [0] * len(steady), (scalar, values, blocking, built, moved)


def test_the_universal_path_reads_back_once_per_step():
    """Each trial's own optimizer steps (or not) on the host: which trials to step is read back every step."""
    trials = [seeded(lambda: DigitsMLP(hidden_dim=32, lr=0.1), [i])[0] for i in range(4)]
    fused = FusedLightningModule(trials, backend="vmap", summary=False, optimizer_path="universal")
    counter = CountPerStep()
    fit_digits(make_trainer(max_steps=12, limit_val_batches=0, callbacks=[counter]), fused)
    per_step = counter.per_step(1)[1:-1]
    assert per_step
    assert all(count >= 1 for count in per_step), per_step


class SyncsAreErrors(L.Callback):
    """CUDA's sync debug mode set to "error" for the steady steps: any host sync in them raises."""

    def __init__(self, reads: set[int]) -> None:
        self.reads = reads

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, i: int) -> None:
        if i > 0 and i not in self.reads:
            torch.cuda.set_sync_debug_mode("error")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        torch.cuda.set_sync_debug_mode(0)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw"])
@pytest.mark.parametrize("scheduled", [False, True], ids=["fixed", "scheduled"])
@pytest.mark.parametrize("check_every", [16, None], ids=["every16", "default"])
def test_no_host_sync_in_a_steady_cuda_step(optimizer, scheduled, check_every):
    """On a GPU: the same cases as above, each steady step run with syncs raising (TF32 irrelevant here).

    ``None``: the default, 32 on a GPU; the CPU's reads of the loss sum and the gradients' total stay off there.
    """
    cls = ScheduledEveryBatch if scheduled else DigitsMLP
    trials = [
        seeded(lambda lr=lr: cls(hidden_dim=32, lr=lr, optimizer=optimizer), [i])[0]
        for i, lr in enumerate([0.01, 0.03, 0.1, 0.3])
    ]
    fused = FusedLightningModule(
        trials, backend="vmap", summary=False, optimizer_path="fused", divergence_check_every=check_every
    )
    reads = _read_back_steps(20, 32 if check_every is None else check_every)
    trainer = make_trainer(
        accelerator="gpu", max_steps=20, limit_val_batches=0, gradient_clip_val=0.5, callbacks=[SyncsAreErrors(reads)]
    )
    trainer.fit(fused, datamodule=DigitsDataModule())
    assert [fused.results[t]["steps"] for t in range(4)] == [20] * 4
