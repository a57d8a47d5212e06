"""Moved: :mod:`lightning_hydro.fused.lightning.strategy_view` (the Lightning-facing pieces).

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_MOVED = {
    "TrialOptimizerSource": "lightning_hydro.fused.lightning.strategy_view",
    "TrialStrategyView": "lightning_hydro.fused.lightning.strategy_view",
    "refuse_inside_vmap": "lightning_hydro.fused.lightning.strategy_view",
    "scheduler_configs_of": "lightning_hydro.fused.lightning.strategy_view",
}

__getattr__ = renamed_names(
    __name__,
    {
        name: Renamed(f"{where}:{name}", f"moved to {where}.{name}; import it from there")
        for name, where in _MOVED.items()
    },
)
