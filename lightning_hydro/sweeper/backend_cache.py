"""Moved to the job's side: :mod:`lightning_hydro.sweeper.job.backend_cache`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "BACKEND_FILE",
    "BackendCache",
    "model_signature",
    "read_json",
    "write_json_atomic",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.job.backend_cache:{name}",
        f"moved to lightning_hydro.sweeper.job.backend_cache.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
