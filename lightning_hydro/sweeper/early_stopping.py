"""Moved to the job's side: :mod:`lightning_hydro.sweeper.job.early_stopping`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "EarlyStoppingSpec",
    "REFILLING",
    "RefillSpec",
    "RungStore",
    "SWEEP_TRIAL_PREFIX",
    "build_stopping_callback",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.job.early_stopping:{name}",
        f"moved to lightning_hydro.sweeper.job.early_stopping.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
