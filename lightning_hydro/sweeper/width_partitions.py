"""Moved to the sweeper's planning side: :mod:`lightning_hydro.sweeper.planning.grouping`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "Partition",
    "Trial",
    "TrialGroup",
    "fused_options",
    "group_by_padded_cost",
    "is_width_refusal",
    "launch_report",
    "needs_padding",
    "partition_label",
    "partition_of",
    "plan_padded_groups",
    "split_refused",
    "width_keys",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.planning.grouping:{name}",
        f"moved to lightning_hydro.sweeper.planning.grouping.{name}; import it from there",
    )
    for name in _NAMES
}
# Imported by planning/grouping.py when it moved, and no longer (its module loads torch); it resolves to where it is
# defined.
_RENAMED["WidthPaddingError"] = Renamed(
    "lightning_hydro.stacking.width_plan:WidthPaddingError",
    "moved to lightning_hydro.stacking.width_plan.WidthPaddingError; import it from there",
)

__getattr__ = renamed_names(__name__, _RENAMED)
