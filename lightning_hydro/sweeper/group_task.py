"""Moved to the job's side: :mod:`lightning_hydro.sweeper.job.group_task`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "CKPT_PATH_KEY",
    "GroupResultMissing",
    "GroupSpec",
    "GroupTask",
    "RESULT_FILE",
    "SweepMetricNotLogged",
    "TRAINER_KEY",
    "assigned_trainer_devices",
    "job_dirs",
    "job_scope",
    "keys_concerned",
    "read_group_spec",
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

# Imported by job/group_task.py when it moved, and no longer at its top (they load Lightning: it imports them in the
# job); they resolve to where they are defined.
_RENAMED.update(
    {
        name: Renamed(f"{home}:{name}", f"moved to {home}.{name}; import it from there")
        for name, home in (
            ("MonitorNotLoggedError", "lightning_hydro.callbacks.callback_arguments"),
            ("built_groups", "lightning_hydro.sweeper.job.group_model"),
            ("describe_trials", "lightning_hydro.sweeper.job.group_model"),
            ("rewrite_model_node", "lightning_hydro.sweeper.job.group_model"),
        )
    }
)

__getattr__ = renamed_names(__name__, _RENAMED)
