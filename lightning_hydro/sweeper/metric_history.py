"""Moved to the job's side: :mod:`lightning_hydro.sweeper.job.metric_history`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "MetricHistory",
    "scalar_metrics",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.job.metric_history:{name}",
        f"moved to lightning_hydro.sweeper.job.metric_history.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
