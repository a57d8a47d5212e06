"""Moved to the sweeper's planning side: :mod:`lightning_hydro.sweeper.planning.reports`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "Record",
    "format_best_table",
    "metric_value",
    "rank_trials",
    "write_json_atomic",
    "write_results",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.planning.reports:{name}",
        f"moved to lightning_hydro.sweeper.planning.reports.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
