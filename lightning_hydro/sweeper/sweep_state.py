"""Moved to the sweeper's planning side: :mod:`lightning_hydro.sweeper.planning.sweep_state`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "Configuration",
    "CorruptStateFile",
    "PLAN_FILE",
    "Partition",
    "STATE_DIR",
    "SweepState",
    "Trial",
    "TrialGroup",
    "partition_label",
    "read_group_result",
    "read_json",
    "write_json_atomic",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.planning.sweep_state:{name}",
        f"moved to lightning_hydro.sweeper.planning.sweep_state.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
