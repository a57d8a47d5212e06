"""Moved to :mod:`lightning_hydro.stopping.trial_record`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro.schedulers import _moved_names

__getattr__ = _moved_names(
    __name__,
    (
        "ENDED_STATUSES",
        "TRIAL_STATUSES",
        "TimeAttr",
        "TrialRecord",
        "TrialResult",
        "TrialStatus",
        "best_trial",
        "format_results_table",
    ),
)
