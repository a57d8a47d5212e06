"""What the template module holds during a vectorised call, in place of Python state that differs between trials.

Under ``vmap`` and ``hfta`` the user's step runs ONCE, on one template module, for all trials. Where the trials'
Python state is the same, the template carries it. Where it is not, or may not stay so, the template holds a
stand-in for the call (:mod:`~lightning_hydro.backends.step_state` installs them):

- :class:`TrialContainer` for a list, dict, set or deque (Lightning 2's ``self.training_step_outputs``): each
  change the step makes (``append``, ``extend``, ``d[key] = v``, ``clear``, ``pop``...) is applied at once to
  every trial's OWN container, with that trial's row of any tensor the step computed (a :class:`Pending`
  placeholder until the vectorised call returns; then the row takes its place). A read (``len``, indexing,
  iteration, ``in``) answers what every trial would answer alone if they agree; what differs between trials is
  returned as a :class:`PerTrialValue`.
- :class:`PerTrialValue` for a value that differs between trials: computing with it raises a
  :class:`~lightning_hydro.backends.errors.FusionError` naming it, each trial's value and the user's line
  (each trial alone would compute with its own value; the fused step has one). Storing it is fine: each trial
  gets its own value back.

The call itself, what it collected and where each trial's share goes, is a
:class:`~lightning_hydro.backends.step_session.StepSession`.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import torch
from torch import Tensor

from lightning_hydro.backends.python_state import CONTAINER_TYPES

if TYPE_CHECKING:
    from lightning_hydro.backends.step_session import StepSession

__all__ = ["Pending", "PerTrialValue", "TrialContainer", "holds_tensor", "is_shareable", "shown"]

# Values every trial may hold as the same object: immutable, without tensors.
_SHAREABLE = (bool, int, float, complex, str, bytes, type(None), enum.Enum, type, torch.dtype, torch.device)


def is_shareable(value: Any) -> bool:
    """Whether ``value`` is an immutable value without tensors (a number, a string, None, an enum, a dtype)."""
    return isinstance(value, _SHAREABLE) or (isinstance(value, (tuple, frozenset)) and all(map(is_shareable, value)))


def holds_tensor(value: Any, depth: int = 3) -> bool:
    """Whether a tensor is reachable from ``value`` through containers and object attributes (a few levels)."""
    if isinstance(value, Tensor):
        return True
    if depth == 0 or is_shareable(value):
        return False
    if isinstance(value, dict):
        return any(holds_tensor(v, depth - 1) for v in value.values())
    if isinstance(value, (list, tuple, set, frozenset, collections.deque)):
        return any(holds_tensor(v, depth - 1) for v in value)
    attributes = getattr(value, "__dict__", None)
    return isinstance(attributes, dict) and any(holds_tensor(v, depth - 1) for v in attributes.values())


def shown(value: Any) -> str:
    """A short form of a value for messages."""
    if isinstance(value, Tensor):
        return f"a tensor of shape {list(value.shape)}"
    if isinstance(value, Pending):
        return "a tensor this step computed"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Pending:
    """A trial's value that holds a tensor computed in the running call: its row exists once the call returns."""

    __slots__ = ("row", "structure")

    def __init__(self, structure: Any, row: int) -> None:
        self.structure, self.row = structure, row

    def __repr__(self) -> str:
        return "<a value this fused step computed; each trial's own after the step>"


# -- the stand-ins ------------------------------------------------------------------------------------------


class PerTrialValue:
    """A value that differs between trials, read inside the vectorised step: any use of it is refused.

    It may be stored (each trial then gets its own value) or dropped; computing with it, comparing it, converting
    it or passing it to torch raises a ``FusionError`` naming it, each trial's value and the line.
    """

    __slots__ = ("_name", "_session", "_values")

    def __init__(self, session: StepSession, name: str, values: Sequence[Any]) -> None:
        self._session, self._name, self._values = session, name, list(values)

    @property
    def trial_values(self) -> list[Any]:
        """Each trial's value, in row order (for what may take one value per trial, such as ``self.log``)."""
        return self._values

    def refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        """Raise the error for a use of the value inside the vectorised step."""
        self._session.refuse(f"uses {self._session.describe(self._name, self._values)}, which differs between trials")

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        _first_stand_in((*args, *(kwargs or {}).values())).refuse()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # protocol probes (copy, pickle, hasattr) get the usual answer
            raise AttributeError(name)
        self.refuse()

    def __repr__(self) -> str:
        return f"<{self._name}: differs between trials>"

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __truediv__ = __rtruediv__ = refuse
    __pow__ = __neg__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __float__ = __int__ = __index__ = refuse
    __getitem__ = __len__ = __iter__ = __eq__ = __ne__ = __abs__ = __round__ = __floordiv__ = __mod__ = refuse
    __rfloordiv__ = __rmod__ = __matmul__ = __rmatmul__ = __rpow__ = __contains__ = __call__ = __format__ = refuse
    __and__ = __or__ = __xor__ = __invert__ = __pos__ = __iadd__ = __isub__ = __imul__ = __setitem__ = refuse
    __hash__ = object.__hash__


def _first_stand_in(values: Iterable[Any]) -> Any:
    for value in values:
        if type(value) in (PerTrialValue, TrialContainer):
            return value
        if isinstance(value, (list, tuple)):
            found = _first_stand_in(value)
            if found is not None:
                return found
    return None


class TrialContainer:
    """Stands in for a list, dict, set or deque attribute: changes go to each trial's own container.

    Args:
        session: the running call.
        name: how the user's code names it (``"self.training_step_outputs"``), for messages.
        containers: each trial's own container, in row order.
    """

    __slots__ = ("_containers", "_name", "_session")

    def __init__(self, session: StepSession, name: str, containers: Sequence[Any]) -> None:
        self._session, self._name, self._containers = session, name, list(containers)

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        return type(self._containers[0])  # isinstance(self.outputs, list) holds inside the step, as alone

    def __repr__(self) -> str:
        return f"<{self._name}: each trial's own {type(self._containers[0]).__name__}>"

    def _refuse(self, what: str) -> NoReturn:
        self._session.refuse(f"{what} {self._name}, which a fused step cannot do for each trial's own container")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        self._refuse(f"calls .{name}() of")

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        stand_in = _first_stand_in((*args, *(kwargs or {}).values()))
        name = getattr(func, "__name__", str(func))
        stand_in._session.refuse(
            f"passes {stand_in._name} to torch ({name}); each trial's {stand_in._name} holds that trial's own values"
        )

    # -- reads: the answer every trial would give, if they agree --------------------------------------------

    def _reconcile(self, values: Sequence[Any], name: str) -> Any:
        first = values[0]
        if all(v is first for v in values) and not isinstance(first, (*CONTAINER_TYPES, Pending)):
            return first
        if all(isinstance(v, CONTAINER_TYPES) and type(v) is not TrialContainer for v in values):
            return TrialContainer(self._session, name, values)
        if is_shareable(first) and all(type(v) is type(first) and v == first for v in values):
            return first
        return PerTrialValue(self._session, name, values)

    def _agreed(self, values: Sequence[Any], what: str) -> Any:
        """For reads Python requires a plain answer from (``len``, ``bool``, ``in``): the same in every trial."""
        if all(v == values[0] for v in values):
            return values[0]
        self._session.refuse(f"{what} {self._session.describe(self._name, values)}, which differs between trials")

    def __len__(self) -> int:
        return self._agreed([len(c) for c in self._containers], "takes the length of")

    def __bool__(self) -> bool:
        return self._agreed([bool(c) for c in self._containers], "tests")

    def __contains__(self, item: Any) -> bool:
        if isinstance(item, Tensor) or type(item) in (PerTrialValue, TrialContainer):
            self._refuse("looks up a per-trial value in")
        return self._agreed([item in c for c in self._containers], "looks up a value in")

    def __getitem__(self, key: Any) -> Any:
        return self._reconcile([c[key] for c in self._containers], f"{self._name}[{key!r}]")

    def get(self, key: Any, default: Any = None) -> Any:
        """``dict.get`` for each trial."""
        return self._reconcile([c.get(key, default) for c in self._containers], f"{self._name}[{key!r}]")

    def __iter__(self) -> Iterator[Any]:
        first = self._containers[0]
        if isinstance(first, (dict, set)):
            keys = self._agreed([list(c) for c in self._containers], "iterates over")
            yield from (self._reconcile([k], f"{self._name} key") for k in keys) if isinstance(first, set) else keys
            return
        for index in range(len(self)):
            yield self[index]

    def __reversed__(self) -> Iterator[Any]:
        for index in range(len(self) - 1, -1, -1):
            yield self[index]

    def keys(self) -> list[Any]:
        """``dict.keys`` (as a list), the same in every trial."""
        return list(iter(self))

    def values(self) -> list[Any]:
        """``dict.values``, each reconciled over the trials."""
        return [self[key] for key in self.keys()]

    def items(self) -> list[tuple[Any, Any]]:
        """``dict.items``, each value reconciled over the trials."""
        return [(key, self[key]) for key in self.keys()]

    def copy(self) -> TrialContainer:
        """Each trial's own shallow copy."""
        return TrialContainer(self._session, f"{self._name}.copy()", [c.copy() for c in self._containers])

    def index(self, value: Any, *args: Any) -> Any:
        """``list.index`` for each trial."""
        return self._reconcile([c.index(value, *args) for c in self._containers], f"{self._name}.index(...)")

    def count(self, value: Any) -> Any:
        """``list.count`` for each trial."""
        return self._reconcile([c.count(value) for c in self._containers], f"{self._name}.count(...)")

    def __eq__(self, other: Any) -> Any:
        others = other._containers if type(other) is TrialContainer else [other] * len(self._containers)
        return self._reconcile([c == o for c, o in zip(self._containers, others)], f"{self._name} == ...")

    def __ne__(self, other: Any) -> Any:
        others = other._containers if type(other) is TrialContainer else [other] * len(self._containers)
        return self._reconcile([c != o for c, o in zip(self._containers, others)], f"{self._name} != ...")

    __hash__ = None  # type: ignore[assignment]

    # -- changes: applied to every trial's own container --------------------------------------------------------

    def _apply(self, method: str, *args: Any, key: Any = None, value_at: int | None = None) -> list[Any]:
        """``container.method(*args)`` on each trial's container with its own values; returns the results.

        ``value_at`` names the argument that is stored (a placeholder where it holds this call's tensors).
        """
        structures = [self._session.take(arg, self._name) for arg in args]
        results = []
        for row, container in enumerate(self._containers):
            self._session.save(container)
            values = [
                self._session.place(s, row) if i == value_at else self._session.build(s, None, row)
                for i, s in enumerate(structures)
            ]
            results.append(getattr(container, method)(*values))
            if value_at is not None:
                self._session.placed(container, key if key is not None else None, values[value_at])
        return results

    def append(self, value: Any) -> None:
        """``append`` to each trial's own list, with the trial's row of any tensor."""
        self._apply("append", value, value_at=0)

    def appendleft(self, value: Any) -> None:
        """``deque.appendleft`` for each trial."""
        self._apply("appendleft", value, value_at=0)

    def add(self, value: Any) -> None:
        """``set.add`` for each trial."""
        self._apply("add", value, value_at=0)

    def extend(self, values: Iterable[Any]) -> None:
        """``extend`` each trial's own list, item by item."""
        for value in list(values):
            self.append(value)

    def extendleft(self, values: Iterable[Any]) -> None:
        """``deque.extendleft`` for each trial."""
        for value in list(values):
            self.appendleft(value)

    def __iadd__(self, values: Iterable[Any]) -> TrialContainer:
        self.extend(values)
        return self

    def insert(self, index: int, value: Any) -> None:
        """``list.insert`` for each trial."""
        self._apply("insert", index, value, value_at=1)

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(key, slice):
            self._refuse("assigns a slice of")
        self._apply("__setitem__", key, value, key=key, value_at=1)

    def setdefault(self, key: Any, default: Any = None) -> Any:
        """``dict.setdefault`` for each trial (a new default is each trial's own copy)."""
        results = self._apply("setdefault", key, default, key=key, value_at=1)
        return self._reconcile(results, f"{self._name}[{key!r}]")

    def update(self, *args: Any, **kwargs: Any) -> None:
        """``dict.update`` / ``set.update`` for each trial, item by item."""
        if isinstance(self._containers[0], set):
            for values in args:
                for value in list(values):
                    self.add(value)
            return
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __delitem__(self, key: Any) -> None:
        self._apply("__delitem__", key)

    def pop(self, *args: Any) -> Any:
        """``pop`` for each trial; the popped values are reconciled (a :class:`PerTrialValue` if they differ)."""
        return self._reconcile(self._apply("pop", *args), f"{self._name}.pop()")

    def popleft(self) -> Any:
        """``deque.popleft`` for each trial."""
        return self._reconcile(self._apply("popleft"), f"{self._name}.popleft()")

    def popitem(self) -> Any:
        """``dict.popitem`` for each trial."""
        return self._reconcile(self._apply("popitem"), f"{self._name}.popitem()")

    def remove(self, value: Any) -> None:
        """``remove`` a plain value from each trial's container."""
        if not is_shareable(value):
            self._refuse("removes a per-trial value from")
        self._apply("remove", value)

    def discard(self, value: Any) -> None:
        """``set.discard`` a plain value in each trial."""
        if not is_shareable(value):
            self._refuse("discards a per-trial value from")
        self._apply("discard", value)

    def clear(self) -> None:
        """``clear`` each trial's own container."""
        self._apply("clear")

    def reverse(self) -> None:
        """``reverse`` each trial's own list."""
        self._apply("reverse")

    def sort(self, **kwargs: Any) -> None:
        """``sort`` each trial's own list (its own elements, compared as alone)."""
        if any(isinstance(v, Pending) for c in self._containers for v in c):
            self._refuse("sorts tensors this step computed in")
        for container in self._containers:
            self._session.save(container)
            container.sort(**kwargs)
