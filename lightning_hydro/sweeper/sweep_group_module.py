"""Moved to the job's side: :mod:`lightning_hydro.sweeper.job.sweep_group_module`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "BackendCache",
    "FusedLightningModule",
    "GroupResultWriter",
    "GroupSearch",
    "GroupSpec",
    "REFILLING",
    "SweepGroupModule",
    "build_stopping_callback",
    "group_stopping",
    "model_signature",
    "read_group_result",
    "write_group_result",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.job.sweep_group_module:{name}",
        f"moved to lightning_hydro.sweeper.job.sweep_group_module.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
