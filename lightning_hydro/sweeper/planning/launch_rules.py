"""What a group job may ask of its launcher: GPUs and DDP, checked before any job of a sweep starts.

A job's Trainer decides how many processes its fit runs in (``trainer.devices``, ``trainer.strategy``); the launcher
decides where the job runs. Some pairs cannot work, and are refused at launch with the reason and the remedy:

- ``ddp_spawn`` (and ``ddp_fork``/``ddp_notebook``) fit in processes that get a pickled copy of the job's Trainer,
  group and refill source, and hand back only rank 0's weights: a sweep job cannot run that way;
- DDP (Lightning's subprocess launcher re-runs the command line for each further rank) works in the basic launcher's
  jobs, where the command line is the sweep's own (the re-run process runs only its group's job: see
  :mod:`~lightning_hydro.sweeper.job.rank_relaunch`), but not in joblib's, submitit_local's or Ray's worker processes;
- on SLURM, Lightning starts no processes itself: the job needs ``tasks_per_node`` equal to its devices.

Where the jobs run on this machine, :func:`plan_devices` deals the GPUs to them
(:class:`~lightning_hydro.sweeper.planning.device_plan.DevicePlan`); a cluster (SLURM's ``gpus_per_node``, Ray's
``num_gpus``) places them itself.

Example::

    >>> placement = TrainerPlacement.from_config({"accelerator": "auto", "devices": "auto"})
    >>> plan = plan_devices("joblib", placement, ["0", "1", "2", "3"], devices_per_group=None)
    >>> plan.blocks  # devices: auto in a parallel job means one GPU each, not DDP over all of them
    ((0,), (1,), (2,), (3,))
    >>> check_launch("joblib", TrainerPlacement(devices=2, strategy="ddp"), gpus=4, processes=2)
    Traceback (most recent call last):
    ...
    ValueError: lightning_hydro sweeper: each group job would run DDP over 2 processes ...
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from omegaconf import DictConfig, ListConfig, OmegaConf

from lightning_hydro.sweeper.app_config import TRAINER_KEY
from lightning_hydro.sweeper.planning.device_plan import DevicePlan, visible_gpus

__all__ = [
    "LauncherKind",
    "TrainerPlacement",
    "check_launch",
    "gpus_matter",
    "launcher_kind",
    "plan_devices",
    "plan_sweep_devices",
]

log = logging.getLogger(__name__)

LauncherKind = Literal["basic", "joblib", "submitit_local", "submitit_slurm", "ray", "other"]
_ON_THIS_MACHINE = ("basic", "joblib", "submitit_local")
_SPAWNING = ("ddp_spawn", "ddp_fork", "ddp_notebook")
_P = "lightning_hydro sweeper"


def launcher_kind(target: str) -> LauncherKind:
    """The kind of launcher a ``hydra.launcher._target_`` names."""
    name = target.lower()
    if name.endswith("basiclauncher"):
        return "basic"
    if "joblib" in name:
        return "joblib"
    if "submitit" in name:
        return "submitit_local" if name.endswith("locallauncher") else "submitit_slurm"
    if "ray" in name:
        return "ray"
    return "other"


@dataclass(frozen=True)
class TrainerPlacement:
    """Where a job's Trainer runs: the ``trainer`` section's ``accelerator``, ``devices`` and ``strategy``."""

    accelerator: str = "auto"
    devices: Any = "auto"
    strategy: str = "auto"

    @classmethod
    def from_config(cls, trainer: Mapping[str, Any]) -> TrainerPlacement:
        """Read the placement from a ``trainer`` config section (Lightning's defaults where unset)."""
        strategy = trainer.get("strategy", "auto")
        if isinstance(strategy, Mapping):  # an instantiable strategy, e.g. DDPStrategy(start_method="spawn")
            target = str(strategy.get("_target_", "")).rsplit(".", 1)[-1].lower()
            method = strategy.get("start_method", "popen")
            strategy = f"ddp_{method}" if target == "ddpstrategy" and method != "popen" else target
        return cls(str(trainer.get("accelerator", "auto")), trainer.get("devices", "auto"), str(strategy or "auto"))

    @property
    def spawns(self) -> bool:
        """Whether the strategy fits in processes it spawns from the job's process."""
        return self.strategy.startswith(_SPAWNING)

    def on_gpu(self, gpus: int) -> bool:
        """Whether the job runs on GPUs, on a machine that shows ``gpus`` of them."""
        return self.accelerator in ("gpu", "cuda") or (self.accelerator == "auto" and gpus > 0)

    def processes(self, gpus: int) -> int:
        """How many processes (one per device) the job's fit runs in, on a machine that shows ``gpus`` GPUs."""
        count = _device_count(self.devices)
        if count is not None:
            return count
        return gpus if self.on_gpu(gpus) else 1  # "auto" / -1: every GPU, or one process on the CPU


def _device_count(devices: Any) -> int | None:
    """The number of devices ``trainer.devices`` names explicitly; None for ``auto`` and ``-1`` (all of them)."""
    if isinstance(devices, str):
        listed = [d for d in devices.split(",") if d.strip()]
        if len(listed) > 1:
            return len(listed)
        devices = int(devices) if devices.strip().lstrip("-").isdigit() else None
    if isinstance(devices, Sequence):
        return len(devices)
    if devices is None or devices == -1:
        return None
    return int(devices)


def gpus_matter(kind: LauncherKind, placement: TrainerPlacement, *, devices_per_group: int | None) -> bool:
    """Whether the GPUs this machine shows can change the jobs' devices or :func:`check_launch`'s verdict.

    They are dealt to the jobs by :func:`plan_devices` (joblib, submitit_local; basic with ``devices_per_group``),
    and otherwise read only as the processes of a Trainer whose ``devices`` is ``auto``/``-1``, which matter to a
    spawning strategy, Ray and SLURM. Elsewhere (the Trainer names an accelerator other than a GPU, the basic
    launcher without ``devices_per_group``, a launcher of another kind) :func:`plan_sweep_devices` does not count
    them: counting loads torch, and the default ``python train.py -m`` plans its sweep without it.

    Example::

        >>> gpus_matter("basic", TrainerPlacement(), devices_per_group=None)
        False
        >>> gpus_matter("joblib", TrainerPlacement(), devices_per_group=None)
        True
        >>> gpus_matter("joblib", TrainerPlacement(accelerator="cpu"), devices_per_group=1)
        False
    """
    if placement.accelerator not in ("auto", "gpu", "cuda"):
        return False  # the jobs use no GPU, whatever the machine shows
    if kind in ("joblib", "submitit_local") or (kind == "basic" and devices_per_group is not None):
        return True  # plan_devices deals them
    return _device_count(placement.devices) is None and (placement.spawns or kind in ("ray", "submitit_slurm"))


def plan_devices(
    kind: LauncherKind,
    placement: TrainerPlacement,
    gpus: Sequence[str],
    *,
    devices_per_group: int | None,
    groups_per_device: int = 1,
) -> DevicePlan | None:
    """The GPUs dealt to the jobs, or ``None`` where the sweeper places none.

    None where the jobs run elsewhere (SLURM, Ray: the cluster places them), without GPUs, or with the basic
    launcher and no ``devices_per_group`` (its jobs run one at a time, with the Trainer's own devices).
    ``devices_per_group: null`` with a parallel launcher: the Trainer's ``devices`` if it is a count or a list,
    else (``auto``, ``-1``) one GPU per group.
    """
    if kind not in _ON_THIS_MACHINE or not placement.on_gpu(len(gpus)) or not gpus:
        return None
    if devices_per_group is None:
        if kind == "basic":
            return None
        devices_per_group = _device_count(placement.devices) or 1
    return DevicePlan.for_devices(gpus, devices_per_group=devices_per_group, groups_per_device=groups_per_device)


def check_launch(
    kind: LauncherKind,
    placement: TrainerPlacement,
    *,
    gpus: int,
    processes: int,
    tasks_per_node: int | None = None,
) -> None:
    """Refuse a launcher and Trainer pair that cannot run a group job (see the module docstring).

    Args:
        kind: the launcher.
        placement: the job's Trainer placement.
        gpus: GPUs this machine shows.
        processes: processes each job's fit runs in (its devices).
        tasks_per_node: submitit's ``tasks_per_node`` (SLURM).

    Raises:
        ValueError: naming the setting, why it cannot work, and the fix.
    """
    one_each = "one group per GPU: trainer.devices=1 with hydra.sweeper.devices_per_group=1 and hydra/launcher=joblib"
    if placement.spawns and processes > 1:
        raise ValueError(
            f"{_P}: trainer.strategy={placement.strategy} fits each group in processes it spawns, which get a pickled "
            "copy of the job's Trainer, fused group and refill source and hand back only rank 0's weights; a sweep "
            "group's job cannot run that way. Fix: +trainer.strategy=ddp (Lightning re-runs the sweep's command for "
            f"each further rank, and the sweeper runs only that group's job there), or {one_each}."
        )
    if processes > 1 and kind in ("joblib", "submitit_local", "ray"):
        raise ValueError(
            f"{_P}: each group job would run DDP over {processes} processes (trainer.devices={placement.devices}, "
            f"strategy={placement.strategy}), but the {kind} launcher runs jobs in worker processes, and Lightning's "
            "DDP launcher starts the other ranks by re-running the command line, which is not the job's there. Fix: "
            f"{one_each}; or DDP groups one after another with hydra/launcher=basic; on SLURM, "
            f"hydra/launcher=submitit_slurm with hydra.launcher.tasks_per_node={processes} "
            f"hydra.launcher.gpus_per_node={processes}."
        )
    if processes > 1 and kind == "submitit_slurm" and tasks_per_node not in (None, processes):
        raise ValueError(
            f"{_P}: each group job runs DDP over {processes} devices, but hydra.launcher.tasks_per_node="
            f"{tasks_per_node}: on SLURM each rank is a task that SLURM starts. Fix: "
            f"hydra.launcher.tasks_per_node={processes} hydra.launcher.gpus_per_node={processes}."
        )


def plan_sweep_devices(
    config: DictConfig, *, devices_per_group: int | None, groups_per_device: int
) -> DevicePlan | None:
    """Refuse a launcher that cannot run the jobs' Trainers; deal the GPUs this machine sees to the jobs.

    Args:
        config: the app config (``hydra.launcher`` and ``trainer.accelerator``/``devices``/``strategy`` are read).
        devices_per_group: ``hydra.sweeper.devices_per_group``.
        groups_per_device: ``hydra.sweeper.groups_per_device``.

    Returns:
        The GPUs dealt to the jobs (:func:`plan_devices`), or ``None``.

    Raises:
        ValueError: for a launcher and Trainer that cannot work together (:func:`check_launch`).
    """
    launcher = config.hydra.launcher
    kind = launcher_kind(str(launcher.get("_target_", "")))
    placement = TrainerPlacement.from_config(_trainer_placement(config))
    gpus = visible_gpus() if gpus_matter(kind, placement, devices_per_group=devices_per_group) else []
    plan = plan_devices(
        kind,
        placement,
        gpus,
        devices_per_group=devices_per_group,
        groups_per_device=groups_per_device,
    )
    processes = len(plan.blocks[0]) if plan is not None else placement.processes(len(gpus))
    tasks_per_node = launcher.get("tasks_per_node")
    check_launch(kind, placement, gpus=len(gpus), processes=processes, tasks_per_node=tasks_per_node)
    if plan is not None:
        log.info(
            "lightning_hydro: %d GPU(s) in %d block(s) of %d, at most %d group job(s) per block at a time%s",
            len(gpus),
            len(plan.blocks),
            len(plan.blocks[0]),
            plan.groups_per_device,
            f" ({len(plan.idle)} GPU(s) idle: they make no whole block)" if plan.idle else "",
        )
    elif devices_per_group is not None:
        where = "the cluster places them" if kind not in _ON_THIS_MACHINE else "no GPU is used"
        log.info("lightning_hydro: hydra.sweeper.devices_per_group is not applied: %s", where)
    return plan


def _trainer_placement(config: DictConfig) -> dict[str, Any]:
    """The app config's ``trainer.accelerator``, ``devices`` and ``strategy`` (unset ones left out)."""
    found: dict[str, Any] = {}
    for key in ("accelerator", "devices", "strategy"):
        node = OmegaConf.select(config, f"{TRAINER_KEY}.{key}", default=None)
        found[key] = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig | ListConfig) else node
    return {k: v for k, v in found.items() if v is not None}
