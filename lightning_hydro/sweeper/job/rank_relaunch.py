"""A sweep whose Trainer uses DDP runs one sweep: a rank that Lightning re-launches runs only its group's job.

Lightning's DDP (its subprocess launcher) starts each further rank of a fit by re-running the command line with
``LOCAL_RANK=<r>`` in the environment; in a sweep that command line is the sweep's own (``python train.py -m ...``).
The group job that starts the fit (:class:`~lightning_hydro.sweeper.job.group_task.GroupTask`) leaves its sweep
directory (:data:`SWEEP_DIR_ENV`) next to its group (``LIGHTNING_HYDRO_GROUP``) in the environment the re-run
inherits; there the sweeper finds the overrides that group was launched with (in its spec, ``GroupSpec.launch``) and
runs that one job, the group's other rank, instead of a second sweep (:func:`relaunched_job`).

A job also leaves the process it ran in as it found it (:func:`job_scope`): DDP sets ``LOCAL_RANK``,
``WORLD_SIZE``, ``NODE_RANK`` and ``MASTER_ADDR``/``MASTER_PORT`` in the job's process and leaves its process group
open, and the next job in that process (the basic launcher runs every job in the sweep's process; joblib reuses its
workers) would otherwise take itself for a rank that another process had started, and wait for it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from lightning_hydro.sweeper.group_spec import GROUP_ENV, read_group_spec

__all__ = ["SWEEP_DIR_ENV", "RelaunchedJob", "job_scope", "relaunched_job"]

SWEEP_DIR_ENV = "LIGHTNING_HYDRO_SWEEP_DIR"
_DDP_ENV = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class RelaunchedJob:
    """The group job a re-launched rank runs: its group, the sweep directory, the overrides to launch it with."""

    group_id: str
    sweep_dir: Path
    overrides: list[str]


def relaunched_job(env: Mapping[str, str] | None = None) -> RelaunchedJob | None:
    """The job this process was re-launched for by Lightning's DDP, or ``None`` in the sweep's own process.

    Raises:
        RuntimeError: if this process is a further rank of something other than a group job (a sweep started by
            ``torchrun`` or ``srun`` with several tasks, each of which would run the whole sweep).
        FileNotFoundError: if the group's spec is missing from the sweep directory.
    """
    env = os.environ if env is None else env
    rank = env.get("LOCAL_RANK", "0")
    if rank == "0":
        return None
    group, sweep = env.get(GROUP_ENV), env.get(SWEEP_DIR_ENV)
    if not group or not sweep:
        raise RuntimeError(
            f"lightning_hydro sweeper: this process has LOCAL_RANK={rank} but no sweep group to run, so it was started "
            "as a further rank of the whole sweep (e.g. by torchrun, or srun with several tasks), and each rank would "
            "run every job. Fix: start the sweep in one process (python train.py -m ...); a group job whose Trainer "
            "uses DDP starts its own ranks."
        )
    spec = read_group_spec(Path(sweep), group)
    assert spec is not None  # read_group_spec raises FileNotFoundError for a named group without a spec
    return RelaunchedJob(group, Path(sweep), [*spec.launch, f"hydra.sweep.dir={_quoted(sweep)}"])


def _quoted(value: str) -> str:
    """``value`` as a quoted string of Hydra's override grammar."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


@contextmanager
def job_scope(sweep_dir: Path) -> Iterator[None]:
    """Run a group job: its sweep directory in the environment its DDP ranks inherit; DDP's traces removed after."""
    import torch.distributed as dist

    saved = {key: os.environ.get(key) for key in (*_DDP_ENV, SWEEP_DIR_ENV)}
    group_open = dist.is_available() and dist.is_initialized()
    os.environ[SWEEP_DIR_ENV] = str(sweep_dir)
    try:
        yield
    finally:
        if not group_open and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()  # the job's ranks are gone; the next job's DDP opens a group of its own
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
