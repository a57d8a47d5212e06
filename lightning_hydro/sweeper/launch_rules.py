"""Moved to the sweeper's planning side: :mod:`lightning_hydro.sweeper.planning.launch_rules`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "DevicePlan",
    "LauncherKind",
    "TrainerPlacement",
    "check_launch",
    "launcher_kind",
    "plan_devices",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.planning.launch_rules:{name}",
        f"moved to lightning_hydro.sweeper.planning.launch_rules.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
