"""Moved to :mod:`lightning_hydro.stopping.halving_config`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro.schedulers import _moved_names

__getattr__ = _moved_names(
    __name__,
    (
        "AnyTrialId",
        "HalvingConfig",
        "Mode",
        "Rounding",
        "TrialId",
        "check_budget",
        "check_trial_id",
        "check_value",
        "is_diverged",
        "keep_count",
    ),
)
