"""Moved: :mod:`lightning_hydro.fused.group.book` (the trials' state).

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_MOVED = {
    "TrialBook": "lightning_hydro.fused.group.book",
}

__getattr__ = renamed_names(
    __name__,
    {
        name: Renamed(f"{where}:{name}", f"moved to {where}.{name}; import it from there")
        for name, where in _MOVED.items()
    },
)
