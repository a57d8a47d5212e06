"""Moved: :mod:`lightning_hydro.fused.verify.python_arguments` (first-batch verification).

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_MOVED = {
    "ArgumentCall": "lightning_hydro.fused.verify.python_arguments",
    "check_python_arguments": "lightning_hydro.fused.verify.python_arguments",
    "recorded_arguments": "lightning_hydro.fused.verify.python_arguments",
}

__getattr__ = renamed_names(
    __name__,
    {
        name: Renamed(f"{where}:{name}", f"moved to {where}.{name}; import it from there")
        for name, where in _MOVED.items()
    },
)
