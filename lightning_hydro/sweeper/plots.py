"""Moved to the sweeper's planning side: :mod:`lightning_hydro.sweeper.planning.plots`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "STATUS_COLORS",
    "plot_in_background",
    "plot_sweep",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.planning.plots:{name}",
        f"moved to lightning_hydro.sweeper.planning.plots.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
