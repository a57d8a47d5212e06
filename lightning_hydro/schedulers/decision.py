"""Moved to :mod:`lightning_hydro.stopping.decision`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro.schedulers import _moved_names

__getattr__ = _moved_names(
    __name__,
    (
        "Action",
        "Decision",
        "Reason",
        "off_rung_decision",
        "rung_action",
    ),
)
