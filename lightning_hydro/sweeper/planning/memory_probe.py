"""Measure what a fused group costs per training step: peak memory and time (for Fluid-style group sizing).

On a CUDA device the peak is the allocator's own ``max_memory_allocated``. On the CPU, where torch keeps
no allocator statistics, it is counted from the tensors a step holds: the stacked parameters, their
gradients, the optimizer state, and the activations autograd saves for the backward pass (seen through
``torch.autograd.graph.saved_tensors_hooks``); that is what grows with the number of trials.

Example::

    >>> from lightning_hydro.demos import DigitsDataModule, DigitsMLP
    >>> one = measure_fused_step([DigitsMLP(hidden_dim=32)], DigitsDataModule(), steps=3)
    >>> two = measure_fused_step([DigitsMLP(hidden_dim=32) for _ in range(2)], DigitsDataModule(), steps=3)
    >>> 1.5 < two.peak_bytes / one.peak_bytes < 2.2 and one.step_seconds > 0
    True
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import lightning as L
import torch
from torch import Tensor
from typing_extensions import override

__all__ = ["StepMeasurement", "device_capacity_bytes", "measure_fused_step", "shared_capacity_bytes"]


@dataclass(frozen=True)
class StepMeasurement:
    """Peak bytes held during a training step and the median seconds per step."""

    peak_bytes: float
    step_seconds: float
    device: str


def _bytes(tensor: Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class _StepMeter(L.Callback):
    """Times each training batch and tracks the memory it holds."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.saved_bytes = 0
        self.peak_saved = 0
        self._start = 0.0
        self._hooks: Any = None
        self._seen: set[int] = set()

    def _pack(self, tensor: Tensor) -> Tensor:
        key = tensor.untyped_storage().data_ptr()
        if key not in self._seen:  # count each storage once (views share it)
            self._seen.add(key)
            self.saved_bytes += _bytes(tensor)
        return tensor

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, idx: int) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        self.saved_bytes, self._seen = 0, set()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)
        self._hooks.__enter__()
        self._start = time.perf_counter()

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        self.seconds.append(time.perf_counter() - self._start)
        self._hooks.__exit__(None, None, None)
        if len(self.seconds) > 1:  # the first step also chooses the backend and verifies the fusion
            self.peak_saved = max(self.peak_saved, self.saved_bytes)


def _state_bytes(module: L.LightningModule, optimizers: Sequence[Any]) -> int:
    """Parameters, their gradients and the optimizer state held by a fused module after a step.

    ``optimizers``: the Trainer's after the fit (the fused module's one group optimizer).
    """
    params = list(module.parameters())
    total = sum(_bytes(p) * (2 if p.requires_grad else 1) for p in params)
    total += sum(_bytes(b) for b in module.buffers())
    for optimizer in optimizers:
        fused = optimizer.fused
        if fused is not None:
            total += sum(_bytes(v) for v in fused.state_tensors())
        else:
            states = [s for t in optimizer.trials.values() for s in t.optimizer.state.values()]
            total += sum(_bytes(v) for state in states for v in state.values() if isinstance(v, Tensor))
    return total


def measure_fused_step(
    modules: Sequence[L.LightningModule],
    datamodule: L.LightningDataModule,
    *,
    steps: int = 5,
    backend: str = "vmap",
    accelerator: str = "auto",
    devices: int | list[int] = 1,
) -> StepMeasurement:
    """Train ``modules`` fused for ``steps`` steps and measure peak memory and the median step time.

    The first step (start-up, backend choice) is excluded from the time and the activation count when
    there are several. ``devices``: the Trainer's (one device: ``1`` or the GPU's index in a list, e.g. ``[2]``).
    """
    from lightning_hydro.fused.module import FusedLightningModule

    meter = _StepMeter()
    fused = FusedLightningModule(list(modules), backend=backend, summary=False, verify=False)  # type: ignore[arg-type]
    trainer = L.Trainer(
        max_steps=steps,
        accelerator=accelerator,
        devices=devices,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[meter],
    )
    trainer.fit(fused, datamodule=datamodule)
    device = fused.device
    if device.type == "cuda":
        peak = float(torch.cuda.max_memory_allocated(device))
    else:
        peak = float(_state_bytes(fused, trainer.optimizers) + meter.peak_saved)
    times = meter.seconds[1:] or meter.seconds
    return StepMeasurement(peak_bytes=peak, step_seconds=statistics.median(times), device=str(device))


def device_capacity_bytes(device: str = "cpu", groups_per_device: int = 1) -> float:
    """Memory a group may use on ``device``: its share of the GPU (:func:`shared_capacity_bytes`), or available RAM."""
    if device.startswith("cuda"):
        index = torch.device(device)
        free, total = torch.cuda.mem_get_info(index)
        return shared_capacity_bytes(total, free, torch.cuda.memory_reserved(index), groups_per_device)
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    import os

    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def shared_capacity_bytes(total: float, free: float, own: float, groups_per_device: int) -> float:
    """Memory one group may plan for on a GPU it shares.

    Its share of the device (``total / groups_per_device``: the sweep runs that many group jobs on it at once), and
    never more than what is free now plus what this process holds itself (``own``, e.g. the probe's cached blocks):
    memory that other jobs or processes hold on the device is not there to take.

    Example::

        >>> gib = 2**30
        >>> shared_capacity_bytes(80 * gib, free=80 * gib, own=0, groups_per_device=2) / gib
        40.0
        >>> shared_capacity_bytes(80 * gib, free=30 * gib, own=2 * gib, groups_per_device=2) / gib  # others hold 48
        32.0
    """
    return min(total / groups_per_device, free + own)
