"""Moved to the sweeper's planning side: :mod:`lightning_hydro.sweeper.planning.trial_groups`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "Configuration",
    "Partition",
    "Trial",
    "TrialGroup",
    "partition_label",
    "partition_of",
    "plan_groups",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.planning.trial_groups:{name}",
        f"moved to lightning_hydro.sweeper.planning.trial_groups.{name}; import it from there",
    )
    for name in _NAMES
}
_RENAMED["GroupKind"] = Renamed(
    "lightning_hydro.sweeper.group_spec:GroupKind",
    "moved to lightning_hydro.sweeper.group_spec.GroupKind (the contract between the sweeper and its jobs); import it "
    "from there",
)

__getattr__ = renamed_names(__name__, _RENAMED)
