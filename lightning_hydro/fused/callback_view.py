"""Moved: :mod:`lightning_hydro.fused.lightning.callback_view` (the Lightning-facing pieces).

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_MOVED = {
    "TRIAL_CHECKPOINT_KEY": "lightning_hydro.fused.lightning.callback_view",
    "CallbackTrainerView": "lightning_hydro.fused.lightning.callback_view",
    "LogBuffer": "lightning_hydro.fused.lightning.callback_view",
    "TrialCopies": "lightning_hydro.fused.lightning.callback_view",
    "TrialLogger": "lightning_hydro.fused.lightning.callback_view",
    "trial_checkpoint": "lightning_hydro.fused.lightning.callback_view",
}

__getattr__ = renamed_names(
    __name__,
    {
        name: Renamed(f"{where}:{name}", f"moved to {where}.{name}; import it from there")
        for name, where in _MOVED.items()
    },
)
