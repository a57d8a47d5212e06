"""Moved to the sweeper's planning side: :mod:`lightning_hydro.sweeper.planning.memory_probe`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "StepMeasurement",
    "device_capacity_bytes",
    "measure_fused_step",
    "shared_capacity_bytes",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.planning.memory_probe:{name}",
        f"moved to lightning_hydro.sweeper.planning.memory_probe.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
