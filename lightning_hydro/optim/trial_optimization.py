"""Moved: :mod:`lightning_hydro.optim.optimizer_config` (each trial's configure_optimizers output, parsed).

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_MOVED = {
    "SchedulerSpec": "lightning_hydro.optim.optimizer_config",
    "TrialOptimization": "lightning_hydro.optim.optimizer_config",
    "parse_optimizer_config": "lightning_hydro.optim.optimizer_config",
}

__getattr__ = renamed_names(
    __name__,
    {
        name: Renamed(f"{where}:{name}", f"moved to {where}.{name}; import it from there")
        for name, where in _MOVED.items()
    },
)
