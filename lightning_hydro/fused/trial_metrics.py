"""Moved: :mod:`lightning_hydro.fused.logging.metrics` (what the trials log).

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_MOVED = {
    "MetricOptions": "lightning_hydro.fused.logging.metrics",
    "ReduceFx": "lightning_hydro.fused.logging.metrics",
    "Reducer": "lightning_hydro.fused.logging.metrics",
    "TrialMetrics": "lightning_hydro.fused.logging.metrics",
    "resolve_options": "lightning_hydro.fused.logging.metrics",
}

__getattr__ = renamed_names(
    __name__,
    {
        name: Renamed(f"{where}:{name}", f"moved to {where}.{name}; import it from there")
        for name, where in _MOVED.items()
    },
)
