"""Moved: the rows' health is part of the steady fused step, :mod:`lightning_hydro.fused.step.row_health`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

__getattr__ = renamed_names(
    __name__,
    {
        name: Renamed(
            f"lightning_hydro.fused.step.row_health:{name}",
            f"moved to lightning_hydro.fused.step.row_health.{name} (the steady fused step); import it from there",
        )
        for name in ("HealthReadback", "RowHealth")
    },
)
