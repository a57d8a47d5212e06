"""Moved: each name where ``_MOVED`` says.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_MOVED = {
    "FORWARDED_HOOKS": "lightning_hydro.fused.lightning.hooks",
    "OPTIONAL_HOOKS": "lightning_hydro.fused.lightning.hooks",
    "forward_hook": "lightning_hydro.fused.lightning.hooks",
    "hide_absent_hooks": "lightning_hydro.fused.lightning.hooks",
    "record_step_logs": "lightning_hydro.fused.logging.metrics",
}

__getattr__ = renamed_names(
    __name__,
    {
        name: Renamed(f"{where}:{name}", f"moved to {where}.{name}; import it from there")
        for name, where in _MOVED.items()
    },
)
