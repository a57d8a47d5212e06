"""Capture what a trial module's code passes to ``self.log`` so it can be logged per trial.

The user's ``training_step`` calls ``self.log("train_loss", loss)``. Under a fused backend the step runs
once for all trials (vmap) or once per trial (loop), and ``loss`` is a per-trial value; Lightning's own
``log`` cannot take it. :func:`capture_logs` swaps the module's ``log`` for a recorder while the user's
code runs; the fused module then aggregates the recorded values per trial
(:mod:`lightning_hydro.fused.logging.metrics`).

Example::

    >>> import lightning as L
    >>> module = L.LightningModule()
    >>> with capture_logs(module) as calls:
    ...     module.log("acc", 0.5, prog_bar=True)
    ...     module.log_dict({"loss": 1.0})
    >>> [(c.name, c.value, c.options.get("prog_bar")) for c in calls]
    [('acc', 0.5, True), ('loss', 1.0, False)]
    >>> "log" in vars(module)  # restored afterwards
    False
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["LogCall", "LogRecorder", "capture_logs", "logged_dtype", "stack_values"]

_MISSING = object()


@dataclass
class LogCall:
    """One call of ``self.log`` made by a trial module: the name, the value and the keyword options."""

    name: str
    value: Any
    options: dict[str, Any] = field(default_factory=dict)


class LogRecorder:
    """Stands in for a module's ``self.log`` and records its calls in :attr:`calls`.

    One recorder can be installed once and emptied per call (:meth:`clear`): under ``torch.compile`` the
    installing, which adds and removes an instance attribute, stays out of the traced function (torch 2.11's
    dynamo cannot trace the removal) and the recorder the traced code calls is the same object at every step.
    """

    def __init__(self) -> None:
        self.calls: list[LogCall] = []

    def __call__(self, name: str, value: Any, *args: Any, **options: Any) -> None:
        """``self.log(name, value, ...)``: recorded, not logged."""
        if args:  # positional options: map them onto LightningModule.log's parameter order
            options.update(zip(_LOG_POSITIONAL_OPTIONS, args))
        self.calls.append(LogCall(name, value, options))

    def clear(self) -> None:
        """Forget the recorded calls (a new list: the old one may still be read)."""
        self.calls = []


@contextmanager
def capture_logs(module: nn.Module, recorder: LogRecorder | None = None) -> Iterator[list[LogCall]]:
    """Record the module's ``self.log`` / ``self.log_dict`` calls instead of sending them to Lightning.

    The recorder (a new one unless given) is an instance attribute that shadows ``LightningModule.log`` for the
    duration of the block (``log_dict`` calls ``self.log`` per entry, so it is covered too); the previous state
    is restored on exit, also when the block raises. Blocks may nest. Yields the recorder's list of calls as it
    is on entry (a caller that clears a given recorder reads ``recorder.calls`` instead).
    """
    recorder = LogRecorder() if recorder is None else recorder
    previous = module.__dict__.get("log", _MISSING)
    module.__dict__["log"] = recorder
    try:
        yield recorder.calls
    finally:
        if previous is _MISSING:
            del module.__dict__["log"]
        else:
            module.__dict__["log"] = previous


_LOG_POSITIONAL_OPTIONS = (
    "prog_bar",
    "logger",
    "on_step",
    "on_epoch",
    "reduce_fx",
    "enable_graph",
    "sync_dist",
    "sync_dist_group",
    "add_dataloader_idx",
    "batch_size",
    "metric_attribute",
    "rank_zero_only",
)


def logged_dtype(values: Sequence[Any]) -> torch.dtype:
    """The dtype Lightning logs these values in, one trial's each: float64 where one is, else the default dtype.

    Alone, ``self.log`` keeps a float32 or float64 tensor's dtype, makes other tensors (bf16, ints) and Python numbers
    the default dtype (float64 under ``precision="64-true"``, whose steps run with that default), and reduces an
    epoch's values in that dtype.
    """
    if any(isinstance(v, Tensor) and v.dtype == torch.float64 for v in values):
        return torch.float64
    return torch.get_default_dtype()


def stack_values(values: Sequence[Any], device: torch.device) -> Tensor:
    """Per-row scalar values (tensors or numbers) as one ``[B]`` tensor of :func:`logged_dtype`."""
    dtype = logged_dtype(values)
    return torch.stack([torch.as_tensor(v, dtype=dtype, device=device).detach().reshape(()) for v in values])
