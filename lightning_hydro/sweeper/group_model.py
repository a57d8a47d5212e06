"""Moved to the job's side: :mod:`lightning_hydro.sweeper.job.group_model`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "ArchitectureMismatchError",
    "BACKEND_FILE",
    "BackendCache",
    "GROUP_MODEL_TARGET",
    "GroupSearch",
    "GroupSpec",
    "MODEL_KEY",
    "STATE_DIR",
    "TRIAL_TARGET_KEY",
    "apply_overrides",
    "built_groups",
    "describe_trials",
    "differing_keys",
    "fused_group_model",
    "job_dirs",
    "override_key",
    "read_group_spec",
    "restore_model_node",
    "rewrite_model_node",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.job.group_model:{name}",
        f"moved to lightning_hydro.sweeper.job.group_model.{name}; import it from there",
    )
    for name in _NAMES
}
_RENAMED["trial_seed"] = Renamed(
    "lightning_hydro.sweeper.group_spec:trial_seed",
    "moved to lightning_hydro.sweeper.group_spec.trial_seed (the contract between the sweeper and its jobs); import it "
    "from there",
)

__getattr__ = renamed_names(__name__, _RENAMED)
