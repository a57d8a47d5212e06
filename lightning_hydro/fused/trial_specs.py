"""Moved: :mod:`lightning_hydro.fused.group.specs` (the trials' state).

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_MOVED = {
    "build_from_spec": "lightning_hydro.fused.group.specs",
    "module_spec": "lightning_hydro.fused.group.specs",
    "rebuild_trials": "lightning_hydro.fused.group.specs",
    "restore_width_scaling": "lightning_hydro.fused.group.specs",
    "trials_from_configs": "lightning_hydro.fused.group.specs",
}

__getattr__ = renamed_names(
    __name__,
    {
        name: Renamed(f"{where}:{name}", f"moved to {where}.{name}; import it from there")
        for name, where in _MOVED.items()
    },
)
