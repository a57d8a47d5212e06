"""Moved: :mod:`lightning_hydro.fused.optimization` (the optimizer hand-shake with Lightning).

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_MOVED = {
    "drop_scheduler_configs": "lightning_hydro.fused.optimization",
    "scheduler_configs": "lightning_hydro.fused.optimization",
}

__getattr__ = renamed_names(
    __name__,
    {
        name: Renamed(f"{where}:{name}", f"moved to {where}.{name}; import it from there")
        for name, where in _MOVED.items()
    },
)
