"""Cheap re-reads of the trials' torch settings and train/eval modes, after their own code ran.

A vectorised backend runs one template's Python code for every trial, so a setting (``self.drop.p``) or a mode
(``self.freeze()`` calls ``eval()``) that a trial's hook makes differ would silently run with the template's. The
backend checks both after every hook the trials ran (:func:`~lightning_hydro.backends.python_state.trial_code_ran`),
which at a batch-level hook is every step. The full checks walk every trial's submodules
(:func:`~lightning_hydro.backends.trial_attributes.settings_fingerprint`,
:func:`~lightning_hydro.backends.trial_attributes.differing_modes`); the readers here find each trial's submodules
once and then only check that they are still in place (one dict read per link), and read the values.

Example::

    >>> from torch import nn
    >>> trials = [nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1)) for _ in range(2)]
    >>> modes = ModesReader()
    >>> modes.differing(trials)
    []
    >>> _ = trials[1][1].eval()
    >>> modes.differing(trials)
    ['1']
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn

from lightning_hydro.backends.trial_attributes import differing_modes, settings_fingerprint, submodule_at

__all__ = ["ModesReader", "SettingsReader", "same_settings"]

_MISSING = "<missing>"
_TRAINING = operator.attrgetter("training")


class SettingsReader:
    """Reads the trials' settings (what :func:`settings_fingerprint` compares) at the cost of attribute reads.

    The settings' names are found once, by the full walk; each :meth:`read` then reads only their values. A backend
    checks the settings after every hook the trials ran (:func:`~lightning_hydro.backends.python_state.trial_code_ran`),
    and runs its full check only when a read differs from the last: after a batch-level hook that changed nothing,
    that is the whole cost. A setting a hook adds as a new attribute is not read (the walk found the names).

    Each trial's submodules are looked up once and then only checked to be still in place (one dict read per
    level of their path): a hook that replaces a submodule (``self.drop = nn.Dropout(0.3)``) is followed. Looking
    each one up anew (``get_submodule``) cost 316 us per read for 16 digits MLPs (now 69), at every step with a
    trial hook.
    """

    def __init__(self, modules: Sequence[nn.Module]) -> None:
        names: dict[str, dict[str, None]] = {}
        for fingerprint in settings_fingerprint(modules):
            for path, name in fingerprint:
                names.setdefault(path, {})[name] = None
        self._hparams = tuple(n.removeprefix("hparams.") for n in names.get("", {}) if n.startswith("hparams."))
        self._by_path = {path: tuple(n for n in found if not n.startswith("hparams.")) for path, found in names.items()}
        self._found: dict[int, tuple[nn.Module, list[_FoundSubmodule]]] = {}  # by id(trial module)

    def read(self, modules: Sequence[nn.Module]) -> tuple[Any, ...]:
        """Every trial's values of the settings, in one tuple (compare two with :func:`same_settings`)."""
        values: list[Any] = []
        for module in modules:
            for found in self._submodules(module):
                values.append(found.values(module))
            hparams = getattr(module, "hparams", None)  # Lightning's AttributeDict, or the DictConfig a trial saved
            hparams = hparams if isinstance(hparams, Mapping) else {}
            values.append(tuple(hparams.get(name, _MISSING) for name in self._hparams))
        return tuple(values)

    def _submodules(self, module: nn.Module) -> list[_FoundSubmodule]:
        cached = self._found.get(id(module))
        if cached is None or cached[0] is not module:
            cached = (module, [_FoundSubmodule(module, path, names) for path, names in self._by_path.items()])
            self._found[id(module)] = cached
        return cached[1]


class _FoundSubmodule:
    """A trial's submodule at ``path``, with the chain of ``_modules`` entries that lead to it from the root."""

    def __init__(self, module: nn.Module, path: str, names: tuple[str, ...]) -> None:
        self.path, self.names = path, names
        self._read = operator.attrgetter(*names) if names else lambda sub: ()
        # (a parent's _modules, the key, the child found there); None: not a chain of submodules, looked up each time
        self._chain: list[tuple[dict[str, Any], str, object]] | None = []
        current: Any = module
        for key in path.split(".") if path else ():
            children = getattr(current, "_modules", None)
            if not isinstance(children, dict) or key not in children:
                self._chain = None
                break
            current = children[key]
            self._chain.append((children, key, current))
        self._submodule = current

    def values(self, module: nn.Module) -> tuple[Any, ...]:
        """The setting values, read from the submodule found unless a hook replaced one on its path."""
        sub = self._submodule
        if self._chain is None or any(children.get(key, _MISSING) is not child for children, key, child in self._chain):
            sub = submodule_at(module, self.path)
        try:
            found = self._read(sub)
        except AttributeError:  # a setting the trial's code deleted: read one by one
            return tuple(getattr(sub, name, _MISSING) for name in self.names)
        return found if len(self.names) != 1 else (found,)


def same_settings(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Whether two :meth:`SettingsReader.read` results are equal (a value that cannot be compared: not equal)."""
    try:
        return bool(a == b)
    except Exception:  # e.g. a hook set a setting to a tensor of several elements
        return False


class ModesReader:
    """:func:`~lightning_hydro.backends.trial_attributes.differing_modes` at the cost of reading the modes.

    Each trial's submodules are found once, with every link from a parent to a child and each module's number of
    children; a read checks the links, reads every submodule's ``training`` flag and compares the trials' flags.
    Where they all agree (the steady state) that is the answer; where they differ, or a trial's structure changed
    (a hook replaced or added a submodule), the full walk answers, and the changed trial is found again.
    """

    def __init__(self) -> None:
        self._found: dict[int, tuple[nn.Module, _Submodules]] = {}  # by id(trial module)

    def differing(self, modules: Sequence[nn.Module]) -> list[str]:
        """The outermost submodule paths whose mode is not the same in every trial (as ``differing_modes``)."""
        if not modules:
            return []
        found = [self._submodules(module) for module in modules]
        if all(tree.in_place() for tree in found) and all(tree.paths == found[0].paths for tree in found[1:]):
            first = found[0].modes()
            if all(tree.modes() == first for tree in found[1:]):
                return []
        for module in modules:  # something differs or moved: the full walk says what, and moved trees are found again
            if not self._found[id(module)][1].in_place():
                self._found[id(module)] = (module, _Submodules(module))
        return differing_modes(modules)

    def _submodules(self, module: nn.Module) -> _Submodules:
        cached = self._found.get(id(module))
        if cached is None or cached[0] is not module:
            cached = self._found[id(module)] = (module, _Submodules(module))
        return cached[1]


class _Submodules:
    """A module's submodules as found once (``named_modules``), and the links that must still hold for them."""

    def __init__(self, module: nn.Module) -> None:
        named = list(module.named_modules())
        self.paths = tuple(path for path, _ in named)
        self._modules = tuple(sub for _, sub in named)
        self._links = [(sub._modules, key, child) for sub in self._modules for key, child in sub._modules.items()]
        self._counts = [(sub._modules, len(sub._modules)) for sub in self._modules]

    def in_place(self) -> bool:
        """Whether no link changed and no module gained or lost a child since they were found."""
        return all(len(children) == count for children, count in self._counts) and all(
            children.get(key) is child for children, key, child in self._links
        )

    def modes(self) -> tuple[bool, ...]:
        return tuple(map(_TRAINING, self._modules))
