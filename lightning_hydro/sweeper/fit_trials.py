"""Moved to the job's side: :mod:`lightning_hydro.sweeper.job.fit_trials`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "BackendCache",
    "EarlyStoppingSpec",
    "FusedSettings",
    "GroupSearch",
    "MetricHistory",
    "REFILLING",
    "ROUND_RESULT_FILE",
    "TRIAL_RESULT_FILE",
    "TrainerFactory",
    "TrialResult",
    "TrialStatus",
    "build_stopping_callback",
    "fit_trials",
    "group_stopping",
    "model_signature",
    "read_json_or_redo",
    "scalar_metrics",
    "trial_dir",
    "write_json_atomic",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.job.fit_trials:{name}",
        f"moved to lightning_hydro.sweeper.job.fit_trials.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
