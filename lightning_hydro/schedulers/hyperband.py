"""Moved to :mod:`lightning_hydro.stopping.hyperband`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro.schedulers import _moved_names

__getattr__ = _moved_names(
    __name__,
    (
        "BracketOrder",
        "HyperbandBracket",
        "HyperbandRule",
        "HyperbandRung",
        "assign_to_brackets",
        "bracket_for_position",
        "hyperband_brackets",
    ),
)
