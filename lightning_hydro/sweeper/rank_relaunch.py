"""Moved to the job's side: :mod:`lightning_hydro.sweeper.job.rank_relaunch`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro._deprecation import Renamed, renamed_names

_NAMES = (
    "GROUP_ENV",
    "RelaunchedJob",
    "SWEEP_DIR_ENV",
    "job_scope",
    "read_group_spec",
    "relaunched_job",
)
_RENAMED = {
    name: Renamed(
        f"lightning_hydro.sweeper.job.rank_relaunch:{name}",
        f"moved to lightning_hydro.sweeper.job.rank_relaunch.{name}; import it from there",
    )
    for name in _NAMES
}

__getattr__ = renamed_names(__name__, _RENAMED)
