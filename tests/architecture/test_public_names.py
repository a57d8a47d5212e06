"""Each public name has one home: no object is exported by the ``__all__`` of two subpackages.

Old homes keep resolving a name for one release through a deprecated module ``__getattr__``; those names are
not in any ``__all__``. The root package ``lightning_hydro`` is the one facade: it may re-export a few names,
each from the subpackage that exports it.
"""

import importlib
import pkgutil
import warnings
from typing import Any

import lightning_hydro

# Values that two packages could hold by coincidence rather than by re-export (interned strings, small ints).
_COINCIDENT_TYPES = (str, int, float, bool, bytes, type(None))


def package_exports() -> dict[str, dict[str, Any]]:
    """``__all__`` of every subpackage (at any depth): package name -> {exported name: object}."""
    exports = {}
    for info in pkgutil.walk_packages(lightning_hydro.__path__, f"{lightning_hydro.__name__}."):
        if not info.ispkg:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)  # an __all__ name must not be a deprecated one
            package = importlib.import_module(info.name)
            exports[info.name] = {name: getattr(package, name) for name in getattr(package, "__all__", ())}
    return exports


def test_no_object_is_exported_by_two_subpackages():
    homes: dict[int, list[str]] = {}
    for package, names in package_exports().items():
        for name, value in names.items():
            if not isinstance(value, _COINCIDENT_TYPES):
                homes.setdefault(id(value), []).append(f"{package}.{name}")
    twice = sorted(sorted(paths) for paths in homes.values() if len(paths) > 1)
    assert twice == []


def test_the_root_package_re_exports_only_names_that_one_subpackage_exports():
    exported = {id(value): package for package, names in package_exports().items() for value in names.values()}
    orphans = [
        name
        for name in lightning_hydro.__all__
        if name != "__version__" and id(getattr(lightning_hydro, name)) not in exported
    ]
    assert orphans == []


def test_the_old_homes_still_resolve_with_a_warning():
    import lightning_hydro.fused as fused
    import lightning_hydro.stacking as stacking
    import lightning_hydro.stopping as stopping
    import lightning_hydro.sweeper as sweeper

    moved = [
        (fused, "TrialRecord", stopping),
        (fused, "TrialStatus", stopping),
        (fused, "StackedState", stacking),
        (fused, "ArchitectureMismatchError", stacking),
        (sweeper, "TrialResult", stopping),
    ]
    for old, name, new in moved:
        assert name not in old.__all__
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = getattr(old, name)
        assert value is getattr(new, name)
        assert [w.category for w in caught] == [DeprecationWarning]
        assert f"{old.__name__}.{name} is exported from {new.__name__}" in str(caught[0].message)
