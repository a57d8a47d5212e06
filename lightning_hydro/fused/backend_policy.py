"""Moved: :mod:`lightning_hydro.fused.step.backend_policy` (the steady fused step).

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_MOVED = {
    "BackendPolicy": "lightning_hydro.fused.step.backend_policy",
    "Chooser": "lightning_hydro.fused.step.backend_policy",
}

__getattr__ = renamed_names(
    __name__,
    {
        name: Renamed(f"{where}:{name}", f"moved to {where}.{name}; import it from there")
        for name, where in _MOVED.items()
    },
)
