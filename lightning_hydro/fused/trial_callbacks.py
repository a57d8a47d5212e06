"""Moved: each name where ``_MOVED`` says.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_MOVED = {
    "CallbackNotPerTrialError": "lightning_hydro.fused.lightning.callbacks",
    "TrialEarlyStopping": "lightning_hydro.fused.lightning.early_stopping",
    "TrialLearningRateMonitor": "lightning_hydro.fused.lightning.learning_rate_monitor",
    "TrialModelCheckpoint": "lightning_hydro.fused.lightning.model_checkpoint",
    "per_trial_callbacks": "lightning_hydro.fused.lightning.callbacks",
    "refuse_module_callbacks": "lightning_hydro.fused.lightning.callbacks",
}

__getattr__ = renamed_names(
    __name__,
    {
        name: Renamed(f"{where}:{name}", f"moved to {where}.{name}; import it from there")
        for name, where in _MOVED.items()
    },
)
