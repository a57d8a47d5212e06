"""Moved to the sweeper's planning side: :mod:`lightning_hydro.sweeper.planning.width_groups`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "WidthGroup",
    "Widths",
    "chain_cost",
    "group_by_padded_cost",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.planning.width_groups:{name}",
        f"moved to lightning_hydro.sweeper.planning.width_groups.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
