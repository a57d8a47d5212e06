"""Moved to the job's side: :mod:`lightning_hydro.sweeper.job.fit_from_config`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "BACKEND_FILE",
    "BackendCache",
    "CALLBACKS_KEY",
    "ConfigTrainerFactory",
    "DATA_KEY",
    "DEVICES_ENV",
    "FUSED_KEY",
    "FusedSettings",
    "GroupSearch",
    "GroupSpec",
    "LOGGER_KEY",
    "MODEL_KEY",
    "SCALING_KEY",
    "SEED_KEY",
    "STATE_DIR",
    "ScalingSettings",
    "TRAINER_KEY",
    "TrialResult",
    "TrialSpec",
    "apply_overrides",
    "fit_from_config",
    "fit_trials",
    "job_dirs",
    "measure_fusion_limit",
    "read_group_spec",
    "restore_model_node",
    "write_group_result",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.job.fit_from_config:{name}",
        f"moved to lightning_hydro.sweeper.job.fit_from_config.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
