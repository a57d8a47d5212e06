"""Moved to the job's side: :mod:`lightning_hydro.sweeper.job.group_task`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "CKPT_PATH_KEY",
    "GroupResultMissing",
    "GroupSpec",
    "GroupTask",
    "MonitorNotLoggedError",
    "RESULT_FILE",
    "SweepMetricNotLogged",
    "TRAINER_KEY",
    "assigned_trainer_devices",
    "built_groups",
    "describe_trials",
    "job_dirs",
    "job_scope",
    "keys_concerned",
    "read_group_spec",
    "rewrite_model_node",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.job.group_task:{name}",
        f"moved to lightning_hydro.sweeper.job.group_task.{name}; import it from there",
    )
    for name in _NAMES
}
_RENAMED["ERROR_FILE"] = Renamed(
    "lightning_hydro.sweeper.group_spec:ERROR_FILE",
    "moved to lightning_hydro.sweeper.group_spec.ERROR_FILE (the contract between the sweeper and its jobs); import it "
    "from there",
)

__getattr__ = renamed_names(__name__, _RENAMED)
