"""What every fusion backend does: run one method of the user's module for all trials of a group at once.

A backend receives the group's :class:`~lightning_hydro.stacking.stacked_state.StackedState` and runs e.g.
``training_step(batch, batch_idx)`` so that every trial computes with its own row of the stacked
parameters and buffers, gradients flowing into the stacked tensors. It returns the step's outputs and
everything the user's code logged, stacked along a leading trial dimension.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor

from lightning_hydro.backends.trial_logging import LogCall, stack_values

if TYPE_CHECKING:
    from lightning_hydro.stacking.stacked_state import StackedState

__all__ = ["Backend", "StackedLog", "StepOutputs", "rows_without_output", "stack_logs", "stack_outputs"]


@dataclass
class StackedLog:
    """One metric logged by the user's code, for all rows.

    ``values[row]`` belongs to row ``row``: a ``[B]`` tensor, or a list of per-row objects such as
    torchmetrics ``Metric`` instances.
    """

    name: str
    values: Tensor | list[Any]
    options: dict[str, Any] = field(default_factory=dict)
    rows: tuple[int, ...] | None = None  # the rows that logged it, ``values[i]`` being ``rows[i]``'s (None: every row)


@dataclass
class StepOutputs:
    """What a fused call returned, and what it logged.

    ``output`` is the user's return value with tensors stacked ``[B, ...]``: a tensor, a dict of tensors,
    or None.
    """

    output: Tensor | dict[str, Tensor] | None
    logs: list[StackedLog] = field(default_factory=list)
    per_row: list[Any] | None = None  # the raw per-row return values, where the backend has them
    # the rows whose step returned None while others returned a value (each trial's own code on the loop may skip a
    # batch, as Lightning lets a step do): ``output`` holds zeros there, with no graph
    without_output: tuple[int, ...] = ()
    # each row's batch as its run of the step left it (what it rebound, what it wrote in place), where each row's
    # code ran on a batch of its own (the loop): the trials' batch-end hooks get their own, as alone
    batches: list[Any] | None = None

    def detached(self) -> StepOutputs:
        """The outputs without their autograd graph (and without the logs, which are booked already)."""
        return StepOutputs(
            output=_detach(self.output),
            per_row=None if self.per_row is None else [_detach(v) for v in self.per_row],
            without_output=self.without_output,
            batches=self.batches,
        )

    def cloned(self) -> StepOutputs:
        """The outputs and logs with every tensor copied (a CUDA graph's outputs are overwritten by its next replay)."""
        logs = [StackedLog(log.name, _map_tensors(log.values, Tensor.clone), log.options) for log in self.logs]
        per_row = None if self.per_row is None else [_map_tensors(v, Tensor.clone) for v in self.per_row]
        return StepOutputs(
            output=_map_tensors(self.output, Tensor.clone),
            logs=logs,
            per_row=per_row,
            without_output=self.without_output,
            batches=self.batches,
        )

    def batch_of(self, row: int, batch: Any) -> Any:
        """Row ``row``'s batch after the step: its own where the rows had their own, else ``batch`` (the loader's)."""
        return batch if self.batches is None else self.batches[row]

    def loss(self) -> Tensor | None:
        """The ``[B]`` losses of a ``training_step`` (its tensor, or the dict's ``"loss"``), or None."""
        if self.output is None or isinstance(self.output, Tensor):
            return self.output
        return self.output.get("loss")


def _map_tensors(value: Any, function: Callable[[Tensor], Tensor]) -> Any:
    """``function`` of a tensor, or of each tensor of a dict (an output's shapes); anything else as it is."""
    if isinstance(value, Tensor):
        return function(value)
    if isinstance(value, dict):
        return {k: _map_tensors(v, function) for k, v in value.items()}
    return value


def _detach(value: Any) -> Any:
    return _map_tensors(value, Tensor.detach)


class Backend(ABC):
    """Runs a method of the trial modules for all rows of a stacked group."""

    name: ClassVar[str]

    def __init__(self, group: StackedState) -> None:
        self.group = group

    def rebind(self) -> None:  # noqa: B027 - optional hook, most backends cache nothing
        """The group's rows or devices changed: drop anything cached about them."""

    @abstractmethod
    def run(self, method: str, *args: Any) -> StepOutputs:
        """Call ``method(*args)`` of every trial, each with its own parameters and buffers."""


def stack_outputs(per_row: list[Any], method: str, *, strict: bool = True) -> Tensor | dict[str, Tensor] | None:
    """Stack per-row return values (tensors, dicts of tensors or None) along a new leading dimension.

    A row that returned None while others did not gets zeros of the others' shapes (see
    :func:`rows_without_output`); None from every row gives None. With ``strict=False`` (predictions, which may be
    anything) unstackable values give None, and so does a None in the first row.

    Example::

        >>> stack_outputs([torch.tensor(1.0), None, torch.tensor(3.0)], "training_step")
        tensor([1., 0., 3.])
    """
    first = next((value for value in per_row if value is not None), None) if strict else per_row[0]
    if first is None:
        return None
    if strict and any(value is None for value in per_row):  # (some rows only: ``first`` is one that returned)
        per_row = [_zeros_like(first) if value is None else value for value in per_row]
    if isinstance(first, Tensor):
        return torch.stack(per_row)
    if isinstance(first, Mapping):
        return {
            key: torch.stack([out[key] for out in per_row]) for key, value in first.items() if isinstance(value, Tensor)
        }
    if not strict:
        return None
    raise step_output_error(first, method)


def rows_without_output(per_row: list[Any]) -> tuple[int, ...]:
    """The rows that returned None while another row returned a value (none if every row, or no row, did).

    Example::

        >>> rows_without_output([1, None, 2]), rows_without_output([None, None]), rows_without_output([1, 2])
        ((1,), (), ())
    """
    rows = tuple(row for row, value in enumerate(per_row) if value is None)
    return () if len(rows) == len(per_row) else rows


def _zeros_like(output: Any) -> Any:
    if isinstance(output, Tensor):
        return torch.zeros_like(output, requires_grad=False)
    if isinstance(output, Mapping):
        return {key: _zeros_like(value) for key, value in output.items() if isinstance(value, Tensor)}
    return output


def step_output_error(output: Any, method: str) -> TypeError:
    """The error for a step that returned something other than a tensor, a dict of tensors or None."""
    return TypeError(
        f"{method} returned {type(output).__name__}; a fused trial's step must return a tensor, a dict of "
        "tensors, or None."
    )


def stack_logs(calls_per_row: list[list[LogCall]], device: torch.device) -> list[StackedLog]:
    """Line up each row's recorded ``self.log`` calls by name and stack the values."""
    names: dict[str, dict[str, Any]] = {}
    for calls in calls_per_row:
        for call in calls:
            names.setdefault(call.name, call.options)
    logs: list[StackedLog] = []
    for name, options in names.items():
        values = [next((c.value for c in calls if c.name == name), None) for calls in calls_per_row]
        rows = None
        if any(v is None for v in values):  # only some trials logged it (each trial's own code, on the loop)
            rows = tuple(row for row, v in enumerate(values) if v is not None)
            values = [v for v in values if v is not None]
        if all(isinstance(v, (Tensor, int, float)) for v in values):
            logs.append(StackedLog(name, stack_values(values, device), options, rows))
        else:
            logs.append(StackedLog(name, values, options, rows))
    return logs
