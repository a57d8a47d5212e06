"""The trials' Python state across the vectorised calls of one backend (``vmap``, ``hfta``).

The user's step runs ONCE on a template module for all trials (under ``vmap`` the template is trial 0's own
module; ``hfta`` and padded groups run a converted copy). Trained alone, each trial's module would hold what
its own step did to its Python state. So around every call:

1. **Before** (:meth:`StepState.begin`), each tracked attribute (:mod:`~lightning_hydro.backends.python_state`)
   is compared across the trials: a value every trial shares stays (a copied template gets it); a list, dict,
   set or deque is replaced on the template by a :class:`~lightning_hydro.backends.per_trial_values.TrialContainer`
   that applies the step's changes to every trial's own container; a number, string or tensor that differs
   between trials by a :class:`~lightning_hydro.backends.per_trial_values.PerTrialValue`, which refuses any use
   with a ``FusionError`` naming it and the line (each trial alone would compute with its own value). The
   comparison is redone after the trials' own code ran elsewhere (a hook, a loop step:
   :func:`~lightning_hydro.backends.python_state.trial_code_ran`) and is otherwise kept, with what the calls
   themselves changed.
2. **Inside** the mapped function, after the user's code (:meth:`ActiveCall.collect`): the attributes the step
   assigned, created or deleted are found by identity; the tensors in their new values (vmap's batched
   tensors, which must not leave the transform) are returned from the mapped function with those the
   containers received.
3. **After** (:meth:`ActiveCall.finish`): each trial gets its own value (row b of each tensor; the same number;
   its own copy of a list or object), the stand-ins are removed, and the containers' placeholders become rows.
   If the call fails, :meth:`ActiveCall.abort` puts everything back.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor, nn

from lightning_hydro.backends.errors import FusionError
from lightning_hydro.backends.per_trial_values import PerTrialValue, TrialContainer, is_shareable
from lightning_hydro.backends.python_state import (
    CONTAINER_TYPES,
    FRAMEWORK_KEYS,
    state_generation,
    tracked_modules,
    user_keys,
)
from lightning_hydro.backends.step_session import StepSession

__all__ = ["ActiveCall", "StepState"]

_Kind = Literal["shared", "container", "per_trial", "objects"]


class _Missing:
    def __repr__(self) -> str:
        return "<not set>"


MISSING: Any = _Missing()
_DELETED = object()


def _comparable(value: Any) -> bool:
    """Values whose difference between trials the template cannot hide: numbers, strings, tensors, tuples of them."""
    if value is MISSING or is_shareable(value) or isinstance(value, Tensor):
        return True
    return isinstance(value, tuple) and all(_comparable(v) for v in value)


class _Path:
    """A tracked module path: the template's module there and each trial's."""

    def __init__(self, path: str, template: nn.Module, trials: list[nn.Module]) -> None:
        self.path, self.template, self.trials = path, template, trials
        self.prefix = f"self.{path}." if path else "self."
        self.kinds: dict[str, _Kind] = {}


class StepState:
    """Keeps each trial's Python state as the trial alone would have it, across one backend's vectorised calls.

    Args:
        backend: the backend's name, for messages.
    """

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._layout: tuple[int, ...] = ()
        self._paths: list[_Path] = []
        self._generation = -1
        self._rows: dict[int, weakref.ref[Tensor]] = {}  # tensors handed out as one trial's row, by id
        self._tensor_verdicts: dict[tuple[str, str], tuple[tuple[Any, ...], bool]] = {}

    def _is_row(self, value: Tensor) -> bool:
        ref = self._rows.get(id(value))
        return ref is not None and ref() is value

    def _add_row(self, value: Tensor) -> None:
        if len(self._rows) > 4096:  # drop the rows nobody holds any more
            self._rows = {key: ref for key, ref in self._rows.items() if ref() is not None}
        self._rows[id(value)] = weakref.ref(value)

    def forget(self) -> None:
        """The rows or the template changed: compare everything again at the next call."""
        self._layout = ()

    def begin(
        self, template: nn.Module, trials: Sequence[nn.Module], trial_ids: Sequence[int], method: str
    ) -> ActiveCall:
        """Put the trials' state on the template for one call of ``method``; returns the call to finish or abort."""
        layout = (id(template), *map(id, trials))
        if layout != self._layout:
            self._paths = []
            for path, module in tracked_modules(template):
                try:
                    self._paths.append(_Path(path, module, [trial.get_submodule(path) for trial in trials]))
                except AttributeError:
                    continue
            self._layout, self._generation = layout, -1
        if self._generation != state_generation():
            for entry in self._paths:
                self._classify(entry)
            self._generation = state_generation()
        session = StepSession(self.backend, f"{type(template).__name__}.{method}", trial_ids)
        return ActiveCall(self, session)

    # -- comparing the trials' values -------------------------------------------------------------------------

    def _classify(self, entry: _Path) -> None:
        keys = dict.fromkeys(user_keys(entry.template))
        for trial in entry.trials:
            keys.update(dict.fromkeys(user_keys(trial)))
        entry.kinds = {}
        for key in keys:
            self._classify_key(entry, key)

    def _classify_key(self, entry: _Path, key: str) -> None:
        values = [vars(trial).get(key, MISSING) for trial in entry.trials]
        first = values[0]
        containers = [isinstance(v, CONTAINER_TYPES) for v in values]
        if all(containers):
            entry.kinds[key] = "container"
            return
        if all(v is first for v in values) or (
            is_shareable(first) and all(type(v) is type(first) and v == first for v in values)
        ):
            kind: _Kind = "shared"
        elif any(containers) or all(_comparable(v) for v in values):  # a list in some trials only: differs too
            kind = "per_trial" if not self._equal_tensors(entry, key, values) else "shared"
        else:
            kind = "objects"  # each trial's own object (a config...): compared by the first-batch check instead
        entry.kinds[key] = kind
        if kind == "shared" and entry.template is not entry.trials[0] and first is not MISSING:
            vars(entry.template)[key] = first  # a copied template follows the trials

    def _equal_tensors(self, entry: _Path, key: str, values: Sequence[Any]) -> bool:
        """Whether differing tensor objects hold equal values (a constant kept per trial); cached while unchanged."""
        if not all(isinstance(v, Tensor) for v in values) or any(self._is_row(v) for v in values):
            return False
        fingerprint = tuple((id(v), v._version) for v in values)
        cached = self._tensor_verdicts.get((entry.path, key))
        if cached is not None and cached[0] == fingerprint:
            return cached[1]
        first = values[0]
        equal = all(
            v.shape == first.shape and v.dtype == first.dtype and v.device == first.device and torch.equal(v, first)
            for v in values[1:]
        )
        self._tensor_verdicts[(entry.path, key)] = (fingerprint, equal)
        return equal


class ActiveCall:
    """One vectorised call's handling of the trials' Python state (made by :meth:`StepState.begin`)."""

    def __init__(self, state: StepState, session: StepSession) -> None:
        self.state = state
        self.session = session
        # (path, key, what the template holds during the call, what it held before)
        self._records: list[tuple[_Path, str, Any, Any]] = []
        self._sizes = [len(vars(entry.template)) for entry in state._paths]
        self._changes: list[tuple[_Path, str, Any]] = []
        self._collected = False
        for entry in state._paths:
            attributes = vars(entry.template)
            for key, kind in entry.kinds.items():
                original = attributes.get(key, MISSING)
                if kind == "container":
                    values = [vars(trial).get(key) for trial in entry.trials]
                    attributes[key] = TrialContainer(session, entry.prefix + key, values)
                elif kind == "per_trial":
                    values = [vars(trial).get(key, MISSING) for trial in entry.trials]
                    attributes[key] = PerTrialValue(session, entry.prefix + key, values)
                self._records.append((entry, key, attributes.get(key, MISSING), original))

    def collect(self) -> tuple[Tensor, ...]:
        """Inside the mapped function, after the user's code: the tensors of what the step stored, to return."""
        session = self.session
        self._changes = []
        for entry, key, installed, _ in self._records:
            now = vars(entry.template).get(key, MISSING)
            if now is not installed:
                stored = _DELETED if now is MISSING else session.take(now, entry.prefix + key)
                self._changes.append((entry, key, stored))
        deleted = any(structure is _DELETED for _, _, structure in self._changes)
        for entry, size in zip(self.state._paths, self._sizes):
            attributes = vars(entry.template)
            if len(attributes) != size or deleted:  # attributes the step created
                for key in user_keys(entry.template):
                    if key not in entry.kinds:
                        self._changes.append((entry, key, session.take(attributes[key], entry.prefix + key)))
        self._collected = True
        return tuple(session.tensors)

    @property
    def touched(self) -> bool:
        """Whether the call changed any tracked state (after :meth:`collect`)."""
        return bool(self._changes) or bool(self.session._saved)

    def finish(self, rows: Sequence[Tensor]) -> None:
        """After the call: each trial's share of what the step stored, in its own module; the stand-ins removed.

        Raises:
            FusionError: the call ran without :meth:`collect` (compiled) and stored tensors, which cannot be split.
        """
        if not self._collected:  # a compiled call: the tensors stayed in the graph, only plain values can follow
            self.collect()
            if self.session.tensors:
                names = ", ".join(entry.prefix + key for entry, key, _ in self._changes)
                self.abort()
                raise FusionError(
                    f"backend={self.state.backend!r} with compile=True: {self.session.where} stores tensors in "
                    f"Python state ({names or 'a container'}), which the compiled step cannot hand to each trial. "
                    "Use compile=False."
                )
        unbound = self.session.finish(rows)
        changed = {(id(entry), key) for entry, key, _ in self._changes}
        for entry, key, installed, original in self._records:
            if installed is not original and (id(entry), key) not in changed:
                _set(vars(entry.template), key, original)
        for entry, key, structure in self._changes:
            for row, trial in enumerate(entry.trials):
                value = _DELETED if structure is _DELETED else self.session.build(structure, unbound, row)
                _set(vars(trial), key, value)
                if isinstance(value, Tensor):
                    self.state._add_row(value)
            if entry.template is not entry.trials[0]:
                _set(vars(entry.template), key, vars(entry.trials[0]).get(key, _DELETED))
            if structure is _DELETED:
                entry.kinds.pop(key, None)
            else:
                self.state._classify_key(entry, key)

    def abort(self) -> None:
        """The call failed: the trials' containers and the template's attributes as they were before it."""
        self.session.abort()
        for entry, key, _, original in self._records:
            _set(vars(entry.template), key, original)
        for entry in self.state._paths:
            attributes = vars(entry.template)
            for key in [k for k in attributes if k not in entry.kinds and k not in FRAMEWORK_KEYS]:
                if not key.startswith("__"):
                    del attributes[key]


def _set(attributes: dict[str, Any], key: str, value: Any) -> None:
    if value is MISSING or value is _DELETED:
        attributes.pop(key, None)
    else:
        attributes[key] = value
