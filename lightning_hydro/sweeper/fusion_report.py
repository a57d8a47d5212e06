"""Moved to the sweeper's planning side: :mod:`lightning_hydro.sweeper.planning.fusion_report`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "TrialGroup",
    "nothing_fuses_message",
    "warn_if_nothing_fuses",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.planning.fusion_report:{name}",
        f"moved to lightning_hydro.sweeper.planning.fusion_report.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
