"""Moved: :mod:`lightning_hydro.fused.lightning.trainer_view` (the Lightning-facing pieces).

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_MOVED = {
    "TrialTrainerView": "lightning_hydro.fused.lightning.trainer_view",
    "attach_trainer": "lightning_hydro.fused.lightning.trainer_view",
    "trial_metrics_view": "lightning_hydro.fused.lightning.trainer_view",
}

__getattr__ = renamed_names(
    __name__,
    {
        name: Renamed(f"{where}:{name}", f"moved to {where}.{name}; import it from there")
        for name, where in _MOVED.items()
    },
)
