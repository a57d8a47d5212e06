"""Per-trial optimization of a fused group: the group optimizer, the fused fast path, per-trial clipping."""

from lightning_hydro.optim.clipping import clip_grad_norm_per_trial, clip_grad_value_per_trial
from lightning_hydro.optim.fused_update import FusedAdam, FusedSGD, FusedUpdate, select_fused_update
from lightning_hydro.optim.group_optimizer import (
    OptimizerPath,
    StepReport,
    TrialGroupOptimizer,
    TrialScheduler,
)
from lightning_hydro.optim.trial_optimization import (
    OptimizerConfigError,
    SchedulerSpec,
    TrialOptimization,
    parse_optimizer_config,
)

__all__ = [
    "FusedAdam",
    "FusedSGD",
    "FusedUpdate",
    "OptimizerConfigError",
    "OptimizerPath",
    "SchedulerSpec",
    "StepReport",
    "TrialGroupOptimizer",
    "TrialOptimization",
    "TrialScheduler",
    "clip_grad_norm_per_trial",
    "clip_grad_value_per_trial",
    "parse_optimizer_config",
    "select_fused_update",
]
