"""Moved: :mod:`lightning_hydro.fused.lightning.group_checkpoint` (the Lightning-facing pieces).

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_MOVED = {
    "CHECKPOINT_KEY": "lightning_hydro.fused.lightning.group_checkpoint",
    "group_checkpoint_for_trial": "lightning_hydro.fused.lightning.group_checkpoint",
    "group_state": "lightning_hydro.fused.lightning.group_checkpoint",
    "load_group_checkpoint": "lightning_hydro.fused.lightning.group_checkpoint",
    "restore_group": "lightning_hydro.fused.lightning.group_checkpoint",
}

__getattr__ = renamed_names(
    __name__,
    {
        name: Renamed(f"{where}:{name}", f"moved to {where}.{name}; import it from there")
        for name, where in _MOVED.items()
    },
)
