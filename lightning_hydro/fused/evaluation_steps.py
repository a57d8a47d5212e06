"""Moved: :mod:`lightning_hydro.fused.evaluation.steps` (evaluation).

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_MOVED = {
    "EvaluationSteps": "lightning_hydro.fused.evaluation.steps",
    "predictions_by_trial": "lightning_hydro.fused.evaluation.steps",
}

__getattr__ = renamed_names(
    __name__,
    {
        name: Renamed(f"{where}:{name}", f"moved to {where}.{name}; import it from there")
        for name, where in _MOVED.items()
    },
)
