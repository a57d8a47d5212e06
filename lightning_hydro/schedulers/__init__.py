"""Moved: the early-stopping rules are :mod:`lightning_hydro.stopping` ("scheduler" now names LR schedulers only).

Every old import path resolves there for one release, with a ``DeprecationWarning`` that names the new path:
the package's names (``from lightning_hydro.schedulers import AsyncSuccessiveHalving``: the rules, the rung
stores and the trial vocabulary) and each old module (``lightning_hydro.schedulers.hyperband`` and the others
are stubs).
"""

import importlib
from collections.abc import Callable, Iterable
from typing import Any

from lightning_hydro._deprecation import Renamed, renamed_names
from lightning_hydro.stopping import __all__ as _stopping_names

_WHY = "(early-stopping rules live in lightning_hydro.stopping; 'scheduler' now means an LR scheduler only)"


def _moved_names(module: str, names: Iterable[str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of an old module of this package: each name resolves in its new module."""
    new = module.replace("lightning_hydro.schedulers", "lightning_hydro.stopping", 1)
    return renamed_names(
        module,
        {name: Renamed(f"{new}:{name}", f"moved to {new}.{name} {_WHY}; import it from there") for name in names},
    )


__getattr__ = renamed_names(
    __name__,
    {
        **{
            name: Renamed(
                f"lightning_hydro.stopping:{name}",
                f"moved to lightning_hydro.stopping.{name} {_WHY}; import it from there",
            )
            for name in _stopping_names
        },
        # The rules' names up to 0.1.0, when they shared their names with the callbacks.
        **{
            old: Renamed(
                f"lightning_hydro.stopping:{new}",
                f"is renamed {new} and moved to lightning_hydro.stopping (lightning_hydro.callbacks.{old} is the "
                f"callback); import lightning_hydro.stopping.{new} instead",
            )
            for old, new in {"SuccessiveHalving": "SuccessiveHalvingRule", "Hyperband": "HyperbandRule"}.items()
        },
    },
)

# `open_store` names a function and a module. Importing the module's stub later would set this package's
# attribute to the stub module and hide the function, which `lightning_hydro.schedulers.open_store` was: import
# the stub now (later imports find it loaded and set nothing) and drop the attribute, so the name resolves above.
importlib.import_module(f"{__name__}.open_store")
del globals()["open_store"]
