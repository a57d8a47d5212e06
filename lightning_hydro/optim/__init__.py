"""Per-trial optimization of a fused group: the group optimizer, the fused fast path, per-trial clipping.

Users meet this package through ``FusedLightningModule(optimizer_path=...)``; the names below are what they
may need. The group optimizer (:mod:`~lightning_hydro.optim.group_optimizer`) and the parsing of
``configure_optimizers`` (:mod:`~lightning_hydro.optim.optimizer_config`) stay importable from their modules; the
fused updates (which are not ``torch.optim.Optimizer``s) are part of the steady fused step,
:mod:`lightning_hydro.fused.step.fused_update`.
"""

from lightning_hydro._deprecation import Renamed, renamed_names
from lightning_hydro.optim.clipping import clip_grad_norm_per_trial, clip_grad_value_per_trial
from lightning_hydro.optim.group_optimizer import OptimizerPath
from lightning_hydro.optim.optimizer_config import OptimizerConfigError

__all__ = ["OptimizerConfigError", "OptimizerPath", "clip_grad_norm_per_trial", "clip_grad_value_per_trial"]

# Old names, kept for one release: they read as torch optimizers, which they are not.
__getattr__ = renamed_names(
    __name__,
    {
        old: Renamed(
            f"lightning_hydro.fused.step.fused_update:{new}",
            f"is renamed lightning_hydro.fused.step.fused_update.{new}: it is the fused fast path's update, not a "
            "torch.optim.Optimizer",
        )
        for old, new in {"FusedAdam": "FusedAdamUpdate", "FusedSGD": "FusedSGDUpdate"}.items()
    },
)
