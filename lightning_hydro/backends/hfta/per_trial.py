"""One Python setting per trial (momentum, eps, dropout p, ...), gathered from the B trial modules.

Also the comparison every fused backend uses on the trials' Python values: :func:`values_equal` and
:func:`differing_attributes` (a module's own attributes that differ between trials; the vmap backend's scan of
a whole trial, :func:`~lightning_hydro.backends.trial_attributes.scan_attributes`, builds on it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Generic, TypeVar

import torch
from torch import Tensor, nn

T = TypeVar("T")


def values_equal(first: Any, second: Any) -> bool:
    """Whether two module attribute values are equal: tensors by shape, dtype and content, containers item by item.

    Example::

        >>> values_equal((1, 1), (1, 1)), values_equal(torch.zeros(2), torch.ones(2))
        (True, False)
        >>> values_equal([torch.ones(2)], [torch.ones(2)]), values_equal(torch.ones(2), torch.ones(2).double())
        (True, False)
    """
    if first is second:
        return True
    if isinstance(first, Tensor) or isinstance(second, Tensor):
        if not (isinstance(first, Tensor) and isinstance(second, Tensor)):
            return False
        if first.shape != second.shape or first.dtype != second.dtype:
            return False
        first, second = first.detach(), second.detach()
        if first.device != second.device:
            first, second = first.cpu(), second.cpu()
        return bool(torch.equal(first, second))
    if isinstance(first, (tuple, list)) and isinstance(second, (tuple, list)):
        return (
            type(first) is type(second)
            and len(first) == len(second)
            and all(values_equal(a, b) for a, b in zip(first, second))
        )
    if isinstance(first, dict) and isinstance(second, dict):
        return first.keys() == second.keys() and all(values_equal(first[key], second[key]) for key in first)
    try:
        return bool(first == second)
    except Exception:  # an exotic __eq__: treated as different (callers err towards refusing)
        return False


def differing_attributes(modules: Sequence[object]) -> list[str]:
    """Names of the public attributes of the modules' own (not their submodules') whose values differ.

    ``training`` is left out. A module that lacks an attribute another one has differs there.

    Example::

        >>> differing_attributes([nn.BatchNorm1d(3, momentum=0.1), nn.BatchNorm1d(3, momentum=0.2)])
        ['momentum']
    """
    names: dict[str, None] = {}
    for module in modules:
        names.update(dict.fromkeys(name for name in vars(module) if not name.startswith("_")))
    names.pop("training", None)
    missing = object()
    first = modules[0]
    return [
        name
        for name in names
        if any(
            not values_equal(getattr(first, name, missing), getattr(module, name, missing)) for module in modules[1:]
        )
    ]


@dataclass(frozen=True)
class PerTrial(Generic[T]):
    """The value of one module attribute in each trial, in slot order.

    Args:
        values: one value per trial.

    Example::

        >>> momentum = PerTrial.gather([nn.BatchNorm1d(3, momentum=m) for m in (0.1, 0.2)], "momentum")
        >>> momentum.is_uniform, momentum.column(torch.zeros(1), ndim=2).shape
        (False, torch.Size([2, 1]))
    """

    values: tuple[T, ...]
    # built once per (dtype, device, ndim): a fused operator asks for its column on every forward
    _columns: dict[tuple[torch.dtype, torch.device, int], Tensor] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    @classmethod
    def gather(cls, modules: Sequence[nn.Module], name: str) -> PerTrial[Any]:
        """Reads attribute ``name`` from each trial module."""
        return cls(tuple(getattr(module, name) for module in modules))

    def __len__(self) -> int:
        return len(self.values)

    @cached_property
    def is_uniform(self) -> bool:
        """Whether every trial has the same value (then one ordinary op serves all trials)."""
        return all(values_equal(value, self.values[0]) for value in self.values[1:])

    @property
    def first(self) -> T:
        """The first trial's value: the value of every trial when :attr:`is_uniform`."""
        return self.values[0]

    def column(self, like: Tensor, ndim: int) -> Tensor:
        """The values as a ``[B, 1, ..., 1]`` tensor of ``ndim`` dims, on ``like``'s device and dtype."""
        key = (like.dtype, like.device, ndim)
        if key not in self._columns:
            column = torch.tensor(self.values, dtype=like.dtype, device=like.device)
            self._columns[key] = column.view(len(self.values), *([1] * (ndim - 1)))
        return self._columns[key]

    def select(self, slots: Sequence[int]) -> PerTrial[T]:
        """The values of the trials in ``slots``, in that order (used when trials are removed)."""
        return PerTrial(tuple(self.values[slot] for slot in slots))
