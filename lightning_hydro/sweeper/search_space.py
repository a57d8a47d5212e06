"""Moved to the sweeper's planning side: :mod:`lightning_hydro.sweeper.planning.search_space`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "Choice",
    "Configuration",
    "Dimension",
    "INTERVAL_TAGS",
    "Interval",
    "SearchSpace",
    "override_key",
    "parse_search_space",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.planning.search_space:{name}",
        f"moved to lightning_hydro.sweeper.planning.search_space.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
