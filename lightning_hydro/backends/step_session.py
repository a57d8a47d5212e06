"""One vectorised call of a user method: the tensors its Python state received, and each trial's share of them.

The stand-ins of :mod:`~lightning_hydro.backends.per_trial_values` and :mod:`~lightning_hydro.backends.step_state`
hand what the step stores to a :class:`StepSession`: :meth:`StepSession.take` turns a value into a structure whose
tensors are slots of the mapped function's outputs (vmap's batched tensors must not leave the transform), and after
the call :meth:`StepSession.build` makes each trial's own value from its row of them. The session also remembers
the trials' containers it changed, to put them back if the call fails, and the refusal it raised.
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from torch import Tensor

from lightning_hydro.backends.errors import FusionError, running_user_line
from lightning_hydro.backends.per_trial_values import (
    Pending,
    PerTrialValue,
    TrialContainer,
    holds_tensor,
    is_shareable,
    shown,
)

__all__ = ["StepSession"]


# -- what a stored value becomes per trial -------------------------------------------------------------------


@dataclass(frozen=True)
class _Slot:
    index: int  # the tensor's place in StepSession.tensors (and so in the mapped function's outputs)


@dataclass(frozen=True)
class _Each:
    values: tuple[Any, ...]  # one per trial: trial b gets values[b]


@dataclass(frozen=True)
class _Rebuilt:
    kind: type
    items: tuple[Any, ...]  # structures; for a dict, (key, value) pairs
    maxlen: int | None = None  # a deque's


@dataclass(frozen=True)
class _Copied:
    value: Any  # an object without tensors: trial 0 keeps it, each other trial gets a deep copy


def _has_slots(structure: Any) -> bool:
    if isinstance(structure, _Slot):
        return True
    if isinstance(structure, _Rebuilt):
        return any(_has_slots(item) for item in structure.items)
    return isinstance(structure, tuple) and any(_has_slots(item) for item in structure)


class StepSession:
    """One vectorised call: the tensors its Python state received, and where each trial's row goes afterwards.

    Args:
        backend: the backend's name, for messages.
        where: ``"Class.method"`` of the call, for messages.
        trial_ids: the trials, in row order.
    """

    def __init__(self, backend: str, where: str, trial_ids: Sequence[int]) -> None:
        self.backend = backend
        self.where = where
        self.trial_ids = list(trial_ids)
        self.tensors: list[Tensor] = []
        self.refusal = ""  # the last refusal's text (an error torch raises around it is explained with it)
        self._placements: list[tuple[Any, Any, Pending]] = []
        self._saved: dict[int, tuple[Any, list[Any]]] = {}

    def refuse(self, what: str) -> NoReturn:
        """Raise the :class:`FusionError` for something the step does that cannot run per trial."""
        self.refusal = (
            f"backend={self.backend!r} cannot run {self.where} as each trial would run it alone: it {what}, at "
            f"{running_user_line()}. The step runs once for all trials, so each trial would compute with one value. "
            "Use backend='loop', which runs each trial's own code one after another (backend='auto' does so by "
            "itself)."
        )
        raise FusionError(self.refusal)

    def describe(self, name: str, values: Sequence[Any]) -> str:
        """``name (trial a: x, trial b: y)`` for messages."""
        each = ", ".join(f"trial {tid}: {shown(v)}" for tid, v in zip(self.trial_ids, values))
        return f"{name} ({each})"

    # -- values into per-trial structures and back ----------------------------------------------------------

    def take(self, value: Any, name: str) -> Any:
        """What ``value``, stored by the step, is made of: tensors become slots of the call's outputs."""
        if isinstance(value, Tensor):
            self.tensors.append(value)
            return _Slot(len(self.tensors) - 1)
        if type(value) is TrialContainer:
            return _Each(tuple(value._containers))
        if type(value) is PerTrialValue:
            pending = [v for v in value._values if isinstance(v, Pending)]
            if len(pending) == len(value._values) and all(p.structure is pending[0].structure for p in pending):
                return pending[0].structure  # an element added by this call, stored again: built per trial
            if pending:
                self.refuse(f"stores {value._name}, which holds a tensor this step computed, where it cannot follow")
            return _Each(tuple(value._values))
        if is_shareable(value):
            return value
        kind = type(value)
        if kind is collections.deque:
            return _Rebuilt(kind, tuple(self.take(item, name) for item in value), value.maxlen)
        if kind in (list, tuple, set) or (isinstance(value, tuple) and hasattr(value, "_fields")):
            return _Rebuilt(kind, tuple(self.take(item, name) for item in value))
        if kind is dict:
            return _Rebuilt(dict, tuple((self.take(k, name), self.take(v, name)) for k, v in value.items()))
        if holds_tensor(value):
            self.refuse(
                f"stores a {kind.__name__} object that holds a tensor in {name}; a fused step can split tensors "
                "kept in attributes, lists, tuples and dicts into each trial's own, not inside other objects"
            )
        return _Copied(value)

    def build(self, structure: Any, rows: Sequence[Sequence[Tensor]] | None, row: int) -> Any:
        """Trial ``row``'s value of a structure made by :meth:`take` (``rows[slot][row]``: the tensors' rows)."""
        if isinstance(structure, _Slot):
            if rows is None:
                raise RuntimeError("StepSession.build: a tensor's row is needed before the call returned")
            return rows[structure.index][row]
        if isinstance(structure, _Each):
            return structure.values[row]
        if isinstance(structure, _Copied):
            return structure.value if row == 0 else copy.deepcopy(structure.value)
        if isinstance(structure, _Rebuilt):
            if structure.kind is dict:
                return {self.build(k, rows, row): self.build(v, rows, row) for k, v in structure.items}
            items = [self.build(item, rows, row) for item in structure.items]
            if structure.kind is collections.deque:
                return collections.deque(items, maxlen=structure.maxlen)
            return structure.kind(*items) if hasattr(structure.kind, "_fields") else structure.kind(items)
        return structure

    def place(self, structure: Any, row: int) -> Any:
        """Trial ``row``'s value now: built, or a :class:`Pending` placeholder if it holds tensors of this call."""
        return Pending(structure, row) if _has_slots(structure) else self.build(structure, None, row)

    # -- changes to the trials' containers -------------------------------------------------------------------

    def save(self, container: Any) -> None:
        """Remember a trial container's contents before this call first changes it (for :meth:`abort`)."""
        if id(container) not in self._saved:
            contents = list(container.items()) if isinstance(container, dict) else list(container)
            self._saved[id(container)] = (container, contents)

    def placed(self, container: Any, key: Any, value: Any) -> None:
        """A value went into a trial's container: if it is a placeholder, put the row there after the call."""
        if isinstance(value, Pending):
            self._placements.append((container, key, value))

    def finish(self, rows: Sequence[Tensor]) -> list[tuple[Tensor, ...]]:
        """After the call: each placeholder replaced by its trial's row. Returns the rows (``[slot][row]``)."""
        unbound = [tensor.unbind(0) for tensor in rows]
        for container, key, pending in self._placements:
            _replace(container, key, pending, self.build(pending.structure, unbound, pending.row))
        self._placements, self._saved = [], {}
        return unbound

    def abort(self) -> None:
        """The call failed: every trial container it changed gets its contents back."""
        for container, contents in self._saved.values():
            container.clear()
            if isinstance(container, (dict, set)):
                container.update(contents)
            else:
                container.extend(contents)
        self._placements, self._saved = [], {}


def _replace(container: Any, key: Any, pending: Pending, value: Any) -> None:
    if isinstance(container, dict):
        if key is not None and container.get(key) is pending:
            container[key] = value
            return
        for k, v in container.items():
            if v is pending:
                container[k] = value
                return
    elif isinstance(container, set):
        if pending in container:
            container.discard(pending)
            container.add(value)
    else:  # a list or deque: placeholders are usually at the end
        for index in range(len(container) - 1, -1, -1):
            if container[index] is pending:
                container[index] = value
                return
    # not found: the step removed it again (appended, then popped)
