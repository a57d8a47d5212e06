"""Moved to :mod:`lightning_hydro.stopping.group_sizing`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro.schedulers import _moved_names

__getattr__ = _moved_names(
    __name__,
    (
        "GroupSizePlan",
        "LinearCost",
        "PredictionCheck",
        "check_prediction",
        "plan_group_size",
    ),
)
