"""Moved to the sweeper's planning side: :mod:`lightning_hydro.sweeper.planning.fusion_limit`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "FusionProbe",
    "LinearCost",
    "fusion_limit_from_probe",
    "measure_fusion_limit",
    "plan_group_size",
    "probe_fusion",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.planning.fusion_limit:{name}",
        f"moved to lightning_hydro.sweeper.planning.fusion_limit.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
