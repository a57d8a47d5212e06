"""Moved: :mod:`lightning_hydro.fused.step.manual_steps` (the steady fused step).

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_MOVED = {
    "MANUAL_BACKEND_REASON": "lightning_hydro.fused.step.manual_steps",
    "ManualStepResult": "lightning_hydro.fused.step.manual_steps",
    "ManualSteps": "lightning_hydro.fused.step.manual_steps",
    "choose_loop_for_manual": "lightning_hydro.fused.step.manual_steps",
}

__getattr__ = renamed_names(
    __name__,
    {
        name: Renamed(f"{where}:{name}", f"moved to {where}.{name}; import it from there")
        for name, where in _MOVED.items()
    },
)
