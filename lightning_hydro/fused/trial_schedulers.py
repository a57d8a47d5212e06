"""Each trial's LR schedulers as Lightning scheduler configs (stepped by Lightning's own rules, per trial)."""

from __future__ import annotations

from lightning.pytorch.utilities.types import LRSchedulerConfig

from lightning_hydro.optim.group_optimizer import TrialGroupOptimizer, TrialScheduler

__all__ = ["drop_scheduler_configs", "scheduler_configs"]


def scheduler_configs(optimizer: TrialGroupOptimizer, trial_id: int) -> list[LRSchedulerConfig]:
    """Lightning configs for the trial's schedulers; names and monitored keys get ``/trial_{id}``."""
    configs = []
    for spec in optimizer.trials[trial_id].schedulers:
        configs.append(
            LRSchedulerConfig(
                scheduler=TrialScheduler(optimizer, trial_id, spec.scheduler),  # type: ignore[arg-type]
                name=None if spec.name is None else f"{spec.name}/trial_{trial_id}",
                interval=spec.interval,
                frequency=spec.frequency,
                reduce_on_plateau=spec.reduce_on_plateau,
                monitor=None if spec.monitor is None else f"{spec.monitor}/trial_{trial_id}",
                strict=spec.strict,
            )
        )
    return configs


def drop_scheduler_configs(configs: list[LRSchedulerConfig], trial_id: int) -> None:
    """Remove, in place, the configs of a trial that left the group."""
    configs[:] = [c for c in configs if getattr(c.scheduler, "trial_id", None) != trial_id]
