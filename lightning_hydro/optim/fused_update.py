"""Moved: the fused update is part of the steady fused step, :mod:`lightning_hydro.fused.step.fused_update`.

The old names resolve there for one release, with a ``DeprecationWarning``. The group optimizer of this package
takes the fused path through an interface (:class:`~lightning_hydro.optim.group_optimizer.FastPath`) and does
not import it.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_MOVED = {
    "FusedAdamUpdate": "fused_update",
    "FusedSGDUpdate": "fused_update",
    "FusedUpdate": "fused_update",
    "SkipRows": "fused_update",
    "select_fused_update": "select_update",
}

__getattr__ = renamed_names(
    __name__,
    {
        name: Renamed(
            f"lightning_hydro.fused.step.{module}:{name}",
            f"moved to lightning_hydro.fused.step.{module}.{name} (the steady fused step); import it from there",
        )
        for name, module in _MOVED.items()
    },
)
