"""One group per GPU: which GPUs each group job of a sweep gets on this machine.

A job's Trainer takes ``cuda:0`` unless told otherwise, so without a plan a sweep's parallel jobs (joblib,
submitit_local) all land on the first GPU of the node. A :class:`DevicePlan` splits the GPUs the sweep sees into
blocks of ``devices_per_group``, deals the blocks to the jobs round-robin, and lets the sweeper launch at most
``len(blocks) * groups_per_device`` jobs at a time (:meth:`DevicePlan.batches`), so that no GPU runs more group
jobs at once than the user allows, whatever the launcher's own parallelism.

A job learns its block from the environment variable :data:`DEVICES_ENV` (indices into the devices the sweep
sees, which the job's process inherits), and its task (:class:`~lightning_hydro.sweeper.job.group_task.GroupTask`)
turns it into ``trainer.devices=[i, ...]`` where the job runs on GPUs (:func:`assigned_trainer_devices`).
``trainer.devices`` rather than ``CUDA_VISIBLE_DEVICES``: joblib reuses its worker processes, and a process
whose CUDA is initialised no longer sees a changed ``CUDA_VISIBLE_DEVICES``.

Example::

    >>> plan = DevicePlan.for_devices(["0", "1", "2"], devices_per_group=1, groups_per_device=2)
    >>> plan.capacity, plan.assign(4)
    (6, [(0,), (1,), (2,), (0,)])
    >>> [len(batch) for batch in plan.batches(list(range(8)))]
    [6, 2]
    >>> visible_gpus({"CUDA_VISIBLE_DEVICES": "4,5"}, count=lambda: 8)
    ['4', '5']
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

__all__ = [
    "DEVICES_ENV",
    "DevicePlan",
    "assigned_trainer_devices",
    "device_env_override",
    "visible_gpus",
]

DEVICES_ENV = "LIGHTNING_HYDRO_DEVICES"  # a job's GPUs: indices into the devices its sweep sees, e.g. "2,3"
_P = "lightning_hydro sweeper"

T = TypeVar("T")


def visible_gpus(env: Mapping[str, str] | None = None, count: Callable[[], int] | None = None) -> list[str]:
    """The GPUs this process sees: ``CUDA_VISIBLE_DEVICES`` if set (as the jobs inherit it), else CUDA's count."""
    env = os.environ if env is None else env
    listed = env.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    if count is None:
        import torch

        count = torch.cuda.device_count
    return [str(i) for i in range(count())]


@dataclass(frozen=True)
class DevicePlan:
    """Blocks of GPU indices dealt to group jobs, and how many jobs may share a block at once.

    Attributes:
        blocks: each block's GPU indices (into the devices the sweep sees); a job gets one block.
        groups_per_device: jobs that may run at once on one block.
        idle: GPUs left out because they do not make a whole block.
    """

    blocks: tuple[tuple[int, ...], ...]
    groups_per_device: int = 1
    idle: tuple[int, ...] = ()

    @classmethod
    def for_devices(cls, visible: Sequence[str], *, devices_per_group: int, groups_per_device: int = 1) -> DevicePlan:
        """Split ``visible`` GPUs into blocks of ``devices_per_group``.

        Raises:
            ValueError: for settings below 1, or a block larger than the GPUs visible.
        """
        if devices_per_group < 1 or groups_per_device < 1:
            raise ValueError(
                f"{_P}: hydra.sweeper.devices_per_group and groups_per_device must be >= 1, got "
                f"{devices_per_group} and {groups_per_device}."
            )
        if devices_per_group > len(visible):
            raise ValueError(
                f"{_P}: hydra.sweeper.devices_per_group={devices_per_group}, but this machine shows "
                f"{len(visible)} GPU(s) (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}). "
                f"Fix: hydra.sweeper.devices_per_group={max(1, len(visible))} or fewer, and trainer.devices to match."
            )
        count = len(visible) // devices_per_group
        blocks = tuple(tuple(range(b * devices_per_group, (b + 1) * devices_per_group)) for b in range(count))
        idle = tuple(range(count * devices_per_group, len(visible)))
        return cls(blocks, groups_per_device, idle)

    @property
    def capacity(self) -> int:
        """Jobs that may run at once."""
        return len(self.blocks) * self.groups_per_device

    def assign(self, jobs: int) -> list[tuple[int, ...]]:
        """The block of each of ``jobs`` jobs launched together, round-robin over the blocks."""
        return [self.blocks[j % len(self.blocks)] for j in range(jobs)]

    def batches(self, jobs: Sequence[T]) -> list[list[T]]:
        """``jobs`` in launches of at most :attr:`capacity`, each launch dealt blocks by :meth:`assign`."""
        return [list(jobs[i : i + self.capacity]) for i in range(0, len(jobs), self.capacity)]


def device_env_override(block: Sequence[int]) -> str:
    """The Hydra override that hands a job its block of GPUs."""
    return f"++hydra.job.env_set.{DEVICES_ENV}='{','.join(str(i) for i in block)}'"


def assigned_trainer_devices(env: Mapping[str, str], gpus_in_job: int) -> list[int] | None:
    """The ``trainer.devices`` a job's assigned block stands for, or ``None`` (no block, or the job has no GPU).

    Raises:
        RuntimeError: if the block names a GPU this job does not see.
    """
    listed = env.get(DEVICES_ENV)
    if not listed or gpus_in_job == 0:
        return None
    block = [int(i) for i in listed.split(",")]
    if max(block) >= gpus_in_job:
        raise RuntimeError(
            f"{_P}: this job was given GPUs {block} ({DEVICES_ENV}) but sees {gpus_in_job}. The sweeper counts the "
            "GPUs of its own machine: run the jobs there (basic, joblib, submitit_local) with the same "
            "CUDA_VISIBLE_DEVICES, or let the cluster place them (submitit's gpus_per_node, Ray's num_gpus)."
        )
    return block
