"""Moved to the sweeper's planning side: :mod:`lightning_hydro.sweeper.planning.device_plan`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "DEVICES_ENV",
    "DevicePlan",
    "T",
    "assigned_trainer_devices",
    "device_env_override",
    "visible_gpus",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.planning.device_plan:{name}",
        f"moved to lightning_hydro.sweeper.planning.device_plan.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
