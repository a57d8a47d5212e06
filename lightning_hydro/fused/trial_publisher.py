"""Moved: :mod:`lightning_hydro.fused.logging.publisher` (what the trials log).

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_MOVED = {
    "LogFunction": "lightning_hydro.fused.logging.publisher",
    "TrialPublisher": "lightning_hydro.fused.logging.publisher",
    "chosen_trial": "lightning_hydro.fused.logging.publisher",
    "record_step_logs": "lightning_hydro.fused.logging.metrics",
}

__getattr__ = renamed_names(
    __name__,
    {
        name: Renamed(f"{where}:{name}", f"moved to {where}.{name}; import it from there")
        for name, where in _MOVED.items()
    },
)
