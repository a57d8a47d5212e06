"""``fusion_limit: auto``: how many trials of a partition fit in one fused group.

A probe job trains a few steps of the partition's model fused at B=1 and B=2 and measures peak memory
and step time (:func:`measure_fusion_limit`, through
:func:`~lightning_hydro.sweeper.planning.memory_probe.measure_fused_step`). Memory grows about
linearly with B, so ``memory(B) = m1 + (B - 1) * (m2 - m1)``; the limit is the largest B whose
extrapolated memory stays within the device capacity minus a safety margin (the approach of Hydro and
Fluid). The fused group checks its real memory when it starts.

Example::

    >>> probe = FusionProbe(memory_bytes=(1.0e9, 1.5e9), step_seconds=(0.010, 0.012), capacity_bytes=10.0e9)
    >>> fusion_limit_from_probe(probe, safety_margin=0.2, max_limit=64)
    15
    >>> round(probe.step_seconds_at(15), 3)
    0.038
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from lightning_hydro.stopping.group_sizing import LinearCost, plan_group_size

if TYPE_CHECKING:
    import lightning as L

__all__ = ["FusionProbe", "fusion_limit_from_probe", "measure_fusion_limit", "probe_fusion"]


@dataclass(frozen=True)
class FusionProbe:
    """Measurements of a partition fused at B=1 and B=2.

    Attributes:
        memory_bytes: peak device memory of a training step at B=1 and at B=2.
        step_seconds: median time of a training step at B=1 and at B=2.
        capacity_bytes: device memory the group may use.
    """

    memory_bytes: tuple[float, float]
    step_seconds: tuple[float, float]
    capacity_bytes: float

    def memory_at(self, trials: int) -> float:
        """Extrapolated peak memory of a step with ``trials`` fused trials."""
        return _line(self.memory_bytes).predict(trials)

    def step_seconds_at(self, trials: int) -> float:
        """Extrapolated time of a step with ``trials`` fused trials."""
        return _line(self.step_seconds).predict(trials)


def _line(measured: tuple[float, float]) -> LinearCost:
    """The cost line through B=1 and B=2, never decreasing with B (a probe's noise must not predict savings)."""
    at_one, at_two = measured
    return LinearCost.from_measurements(at_one, max(at_two, at_one))


def fusion_limit_from_probe(probe: FusionProbe, *, safety_margin: float, max_limit: int) -> int:
    """Return the largest B (<= ``max_limit``) whose extrapolated memory fits ``capacity * (1 - margin)``.

    The sizing rule is Fluid's, kept once in :func:`~lightning_hydro.stopping.group_sizing.plan_group_size`.

    Raises:
        ValueError: if the settings are out of range, or if even one trial does not fit.
    """
    if not 0.0 <= safety_margin < 1.0:
        raise ValueError(f"fusion_limit_from_probe: safety_margin must be in [0, 1), got {safety_margin}.")
    if max_limit < 1:
        raise ValueError(f"fusion_limit_from_probe: max_limit must be >= 1, got {max_limit}.")
    budget = probe.capacity_bytes * (1.0 - safety_margin)
    m1, m2 = probe.memory_bytes
    if m1 > budget:
        raise ValueError(
            f"fusion_limit_from_probe: one trial needs {m1 / 2**20:.0f} MiB, more than the "
            f"{budget / 2**20:.0f} MiB allowed ({probe.capacity_bytes / 2**20:.0f} MiB less a "
            f"{safety_margin:.0%} margin). Fix: make the partition smaller (batch size, width), or lower "
            "hydra.sweeper.probe.safety_margin."
        )
    plan = plan_group_size(m1, max(m1, m2), probe.capacity_bytes, safety_margin=safety_margin, max_group_size=max_limit)
    return plan.group_size


def probe_fusion(
    build_module: Callable[[int], L.LightningModule],
    trial_ids: Sequence[int],
    *,
    datamodule: L.LightningDataModule,
    trainer_factory: object,
    steps: int = 5,
    backend: str = "vmap",
    groups_per_device: int = 1,
) -> FusionProbe:
    """Measure memory and step time of ``trial_ids`` fused at B=1 and B=2.

    Args:
        build_module: builds the (seeded) module of a trial id.
        trial_ids: two trials of the partition (one if the partition has a single trial: it is built twice).
        datamodule: the partition's data.
        trainer_factory: the job's :class:`~lightning_hydro.sweeper.job.fit_trials.TrainerFactory` (the planning side
            does not import the job's): its ``trainer_kwargs``, the app's Trainer settings, if it has them; their
            ``accelerator`` and, if they name one GPU (``[i]``, as the sweeper sets for a job it gave a GPU),
            ``devices`` are used for the probe.
        steps: training steps per measurement (the first is excluded from the time).
        backend: the fusion backend measured, the same at B=1 and B=2 (not ``auto``, whose choice could
            differ between the two and spoil the extrapolation); ``loop`` for trials that use manual optimization.
        groups_per_device: group jobs that share the GPU at once: each plans for its share of the memory, and no
            more than is free (what other jobs hold counts: see
            :func:`~lightning_hydro.sweeper.planning.memory_probe.shared_capacity_bytes`).
    """
    from lightning_hydro.sweeper.planning.memory_probe import device_capacity_bytes, measure_fused_step

    trainer_kwargs = getattr(trainer_factory, "trainer_kwargs", {})
    accelerator = str(trainer_kwargs.get("accelerator", "auto"))
    devices = trainer_kwargs.get("devices")
    one_gpu = list(devices) if isinstance(devices, list | tuple) and len(devices) == 1 else 1
    pair = list(trial_ids[:2]) if len(trial_ids) >= 2 else [trial_ids[0], trial_ids[0]]
    first = build_module(pair[0])
    if not first.automatic_optimization:  # manual optimization runs on the loop only (fused/manual_steps.py)
        backend = "loop"
    measure = partial(measure_fused_step, datamodule=datamodule, steps=steps, backend=backend, devices=one_gpu)
    measure = partial(measure, accelerator=accelerator)
    one = measure([first])
    two = measure([build_module(t) for t in pair])
    return FusionProbe(
        memory_bytes=(one.peak_bytes, two.peak_bytes),
        step_seconds=(one.step_seconds, two.step_seconds),
        capacity_bytes=device_capacity_bytes(one.device, groups_per_device),
    )


def measure_fusion_limit(
    build_module: Callable[[int], L.LightningModule],
    trial_ids: Sequence[int],
    *,
    datamodule: L.LightningDataModule,
    trainer_factory: object,
    safety_margin: float,
    max_limit: int,
    groups_per_device: int = 1,
) -> tuple[int, FusionProbe]:
    """Probe the partition of ``trial_ids`` (:func:`probe_fusion`) and extrapolate its fusion limit.

    Returns:
        The limit and the measurements it was computed from.
    """
    probe = probe_fusion(
        build_module,
        trial_ids,
        datamodule=datamodule,
        trainer_factory=trainer_factory,
        groups_per_device=groups_per_device,
    )
    return fusion_limit_from_probe(probe, safety_margin=safety_margin, max_limit=max_limit), probe
