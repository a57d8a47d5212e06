"""Old public names that keep working for one release: a module ``__getattr__`` that warns and resolves them.

Pure Python (imports nothing of ours, no torch), so every layer of the package may use it, the pure core
included. The warning names the release that removes the old name: the minor release after the package's
``__version__`` (:func:`removal_version`, read when a warning is raised, not when this module is imported).

Example::

    >>> import warnings
    >>> __getattr__ = renamed_names(
    ...     "lightning_hydro.demo",
    ...     {"OldPath": Renamed("os.path:join", "is now os.path.join; import it from there")},
    ... )
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     join = __getattr__("OldPath")
    >>> join("a", "b")
    'a/b'
    >>> message = str(caught[0].message).replace(removal_version(), "<removal version>")
    >>> print(caught[0].category.__name__, message)  # doctest: +NORMALIZE_WHITESPACE
    DeprecationWarning lightning_hydro.demo.OldPath is now os.path.join; import it from there. The old name will be
    removed in <removal version>.
    >>> next_minor("0.5.2")  # the removal version of a name deprecated in 0.5.2
    '0.6.0'
"""

from __future__ import annotations

import importlib
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Renamed", "RenamedAttribute", "next_minor", "removal_version", "renamed_names"]


def next_minor(version: str) -> str:
    """The minor release after ``version``: ``"0.5.2"`` -> ``"0.6.0"``, ``"1.0.0rc1"`` -> ``"1.1.0"``.

    Raises:
        ValueError: ``version`` does not start with ``major.minor``.
    """
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(
            f"next_minor: expected a version that starts with 'major.minor' (e.g. '0.5.2'), got {version!r}"
        )
    return f"{match[1]}.{int(match[2]) + 1}.0"


def removal_version() -> str:
    """The release that removes a name deprecated in this one: the minor release after ``lightning_hydro.__version__``.

    The package is read when this is called (it is always imported before this module), so importing this
    module imports nothing of ours.
    """
    return next_minor(importlib.import_module("lightning_hydro").__version__)


def _removal_notice() -> str:
    return f"The old name will be removed in {removal_version()}."


@dataclass(frozen=True)
class Renamed:
    """Where an old name now lives, and what the warning says about it.

    Attributes:
        target: ``"package.module:Name"``: what the old name resolves to (imported when first asked for).
        change: The warning's text after ``"{module}.{old name} "``: what changed and the fix.
    """

    target: str
    change: str


def renamed_names(
    module: str, renamed: Mapping[str, Renamed], *, lazy: Mapping[str, str] | None = None
) -> Callable[[str], Any]:
    """A module-level ``__getattr__`` (PEP 562) for ``module`` that resolves the old names in ``renamed``.

    Each old name raises a ``DeprecationWarning`` (attributed to the importing line) and returns its target;
    each name in ``lazy`` is imported from its module when first asked for, without a warning; any other name
    raises Python's usual ``AttributeError``.

    Args:
        module: The module's dotted name (its ``__name__``).
        renamed: Old name -> :class:`Renamed`.
        lazy: Current name -> the module it is imported from, for a package whose public names would load more
            than its own import should (``lightning_hydro.sweeper``: torch and Lightning).

    Returns:
        The function to assign to the module's ``__getattr__``.
    """
    lazy = dict(lazy or {})

    def __getattr__(name: str) -> Any:
        if name in lazy:
            return getattr(importlib.import_module(lazy[name]), name)
        if name not in renamed:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        entry = renamed[name]
        warnings.warn(
            f"{module}.{name} {entry.change}. {_removal_notice()}",
            DeprecationWarning,
            stacklevel=2,
        )
        where, _, attribute = entry.target.partition(":")
        return getattr(importlib.import_module(where), attribute)

    return __getattr__


class RenamedAttribute:
    """A class attribute that reads ``new`` (on the instance) under its old name, with a ``DeprecationWarning``.

    Args:
        new: The attribute's name now.
        change: The warning's text after ``"{class}.{old name} "``: what changed and the fix.

    Example::

        >>> class Run:
        ...     old = RenamedAttribute("new", "is renamed new; use .new")
        ...     def __init__(self) -> None:
        ...         self.new = 3
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     Run().old
        3
    """

    def __init__(self, new: str, change: str) -> None:
        self.new = new
        self.change = change
        self.old = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.old = name

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        warnings.warn(
            f"{type(instance).__name__}.{self.old} {self.change}. {_removal_notice()}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(instance, self.new)
