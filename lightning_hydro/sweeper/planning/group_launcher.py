"""Launching group jobs through the configured Hydra launcher, and recording which failed.

Each job's spec is written (with the overrides it is launched with, which a re-launched DDP rank replays) before
the launcher runs it. The first job of a sweep goes alone: a task function that cannot produce group results fails
there, before the other jobs train. Where the sweeper deals GPUs (:mod:`~lightning_hydro.sweeper.planning.device_plan`)
the jobs go in batches of what the GPUs allow, each with its block of GPUs.
"""

from __future__ import annotations

import dataclasses
import logging
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from hydra.plugins.launcher import Launcher

from lightning_hydro.sweeper.group_spec import ERROR_FILE, RESULT_FILE, GroupSpec, spec_path
from lightning_hydro.sweeper.json_files import write_json_atomic
from lightning_hydro.sweeper.planning.device_plan import DevicePlan, device_env_override
from lightning_hydro.sweeper.planning.grouping import is_width_refusal

__all__ = ["GroupLauncher", "Job", "one_line"]

log = logging.getLogger(__name__)

Job = tuple[GroupSpec, list[str]]
"""A group job: its spec and the overrides it is launched with."""


class GroupLauncher:
    """Launches group jobs and keeps the failures by group id.

    Args:
        launcher: the Hydra launcher the sweeper instantiated.
        sweep_dir: the sweep directory (specs, job directories).
        devices: the GPUs dealt to the jobs, or ``None`` where the sweeper deals none.
        validate_batch: Hydra's check of a batch of overrides (``Sweeper.validate_batch_is_legal``).
        launched_before: whether an earlier run of this sweep launched jobs already (its first job is not
            launched alone again).
    """

    def __init__(
        self,
        launcher: Launcher,
        sweep_dir: Path,
        devices: DevicePlan | None,
        validate_batch: Callable[[list[list[str]]], None],
        *,
        launched_before: bool,
    ) -> None:
        self.launcher = launcher
        self.sweep_dir = sweep_dir
        self.devices = devices
        self.validate_batch = validate_batch
        self.launched_before = launched_before
        self.failures: dict[str, BaseException] = {}
        self.job_idx = 0

    def launch(self, jobs: Sequence[Job]) -> None:
        """Launch the groups (the first job of a sweep alone, then batches of what the GPUs allow); record failures.

        Raises:
            RuntimeError: if the sweep's first job failed (for a reason other than a refused width padding).
        """
        if not jobs:
            return
        if not self.launched_before and len(jobs) > 1:
            # The first job of a sweep goes alone: a task function that cannot produce group results fails
            # there, before the other jobs train.
            self.launched_before = True
            self.launch(jobs[:1])
            first = self.failures.get(jobs[0][0].group_id)
            if first is not None and not is_width_refusal(first):
                raise RuntimeError(
                    f"lightning_hydro sweeper: the sweep's first job failed, so no other job was launched "
                    f"({jobs[0][0].group_id}: {one_line(first)}). Its traceback is in the log above and in "
                    f"{self.sweep_dir / jobs[0][0].group_id / ERROR_FILE}. Fix the cause, then re-run the "
                    "same command (same hydra.sweep.dir)."
                ) from first
            jobs = jobs[1:]
        self.launched_before = True
        for batch in self.devices.batches(jobs) if self.devices is not None else [list(jobs)]:
            self._launch_batch(batch)

    def _launch_batch(self, jobs: Sequence[Job]) -> None:
        """Write each group's spec (with its launch overrides) and launch the groups together."""
        if self.devices is not None:  # a block of GPUs per job, round-robin
            blocks = self.devices.assign(len(jobs))
            jobs = [(spec, [*overrides, device_env_override(b)]) for (spec, overrides), b in zip(jobs, blocks)]
        for spec, overrides in jobs:
            launched = dataclasses.replace(spec, launch=tuple(overrides))  # a re-launched DDP rank replays them
            write_json_atomic(spec_path(self.sweep_dir, spec.group_id), launched.to_json())
        batch = [overrides for _, overrides in jobs]
        self.validate_batch(batch)
        returns = self.launcher.launch(batch, initial_job_idx=self.job_idx)
        self.job_idx += len(batch)
        for (spec, _), ret in zip(jobs, returns):
            try:
                _ = ret.return_value  # raises the job's exception if it failed
            except Exception as err:
                self._log_failure(spec.group_id, err)
                self.failures[spec.group_id] = err
                continue
            if not (self.sweep_dir / spec.group_id / RESULT_FILE).is_file():
                self.failures[spec.group_id] = RuntimeError(
                    f"job {spec.group_id} returned without writing {RESULT_FILE}: its task function must "
                    "train the module that hydra.utils.instantiate(cfg.model) builds, or call "
                    "lightning_hydro.sweeper.fit_from_config(cfg), and every trial must finish "
                    "(an interrupted one is resumed by a rerun)"
                )

    def _log_failure(self, group_id: str, err: BaseException) -> None:
        """Log a failed job's traceback: the one the job wrote (any launcher), else the exception's own."""
        error_file = self.sweep_dir / group_id / ERROR_FILE
        if error_file.is_file():
            text = error_file.read_text(encoding="utf-8")
        else:
            text = "".join(traceback.format_exception(err))
        log.error("lightning_hydro: job %s failed: %s\n%s", group_id, one_line(err), text)


def one_line(err: BaseException) -> str:
    r"""An exception as one line: its type and its message with the whitespace folded.

    Example::

        >>> one_line(ValueError("two\n  lines"))
        'ValueError: two lines'
    """
    return f"{type(err).__name__}: " + " ".join(str(err).split())
