"""Moved to the sweeper's planning side: :mod:`lightning_hydro.sweeper.planning.settings`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "ProbeSettings",
    "RetrainSettings",
    "SAMPLERS",
    "SCHEDULERS",
    "SchedulerSettings",
    "SweepSettings",
    "is_learning_sampler",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.planning.settings:{name}",
        f"moved to lightning_hydro.sweeper.planning.settings.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
