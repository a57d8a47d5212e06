"""Moved to the job's side: :mod:`lightning_hydro.sweeper.job.overrides`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = ("apply_overrides",)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.job.overrides:{name}",
        f"moved to lightning_hydro.sweeper.job.overrides.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
