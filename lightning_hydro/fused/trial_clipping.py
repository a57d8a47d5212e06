"""Gradient clipping of a fused group: each trial clipped as Lightning clips it when it trains alone.

Lightning clips in the LightningModule's ``configure_gradient_clipping(optimizer, val, algorithm)`` hook,
whose default calls ``clip_gradients``, which hands the optimizer's parameters (param-group order) to the
precision plugin and so to ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_``. A fused group calls
that same hook of every trial module with the trial's own optimizer, its parameters' ``.grad`` being views of
their rows of the stacked gradients: the arithmetic is Lightning's and torch's own, on the same numbers, so
on the loop backend with the universal optimizer path a clipped step is bitwise that of a separate run, and a
trial that overrides the hook (its own clipping rule) keeps it.

On the fused optimizer path, when no trial overrides the hook, the rows are clipped in one pass over the
stacked gradients instead (:mod:`lightning_hydro.optim.clipping`): the same formula, summed in another
order (float rounding).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import lightning as L
from lightning.pytorch.utilities.model_helpers import is_overridden

from lightning_hydro.fused.step.fused_path import FusedPath
from lightning_hydro.optim.clipping import clip_grad_norm_per_trial, clip_grad_value_per_trial

if TYPE_CHECKING:
    from lightning_hydro.optim.group_optimizer import TrialGroupOptimizer
    from lightning_hydro.stacking.stacked_state import StackedState

__all__ = ["clip_trial_gradients", "custom_clipping"]


def custom_clipping(modules: Sequence[Any]) -> bool:
    """Whether a trial module overrides ``configure_gradient_clipping`` (its own rule runs then, per trial)."""
    return any(is_overridden("configure_gradient_clipping", m, L.LightningModule) for m in modules)


def clip_trial_gradients(
    group: StackedState,
    optimizer: TrialGroupOptimizer,
    gradient_clip_val: float | None,
    gradient_clip_algorithm: Any,
    *,
    custom: bool | None = None,
) -> None:
    """Clip each live trial's gradients as its own ``configure_gradient_clipping`` hook does.

    Args:
        group: the stacked state (its parameters hold the fused backward's gradients).
        optimizer: the group optimizer, holding each trial's own optimizer.
        gradient_clip_val: ``Trainer(gradient_clip_val=...)`` (None or 0: no clipping unless a trial's hook
            clips by itself).
        gradient_clip_algorithm: ``Trainer(gradient_clip_algorithm=...)``, passed on as Lightning passes it.
        custom: whether a trial overrides ``configure_gradient_clipping`` (:func:`custom_clipping`; None: look).
    """
    if custom is None:
        custom = custom_clipping(group.modules)
    if not custom and not gradient_clip_val:
        return
    if optimizer.active_path == "fused" and not custom:
        by_value = str(getattr(gradient_clip_algorithm, "value", gradient_clip_algorithm)) == "value"
        fused = optimizer.fused
        if isinstance(fused, FusedPath):  # it keeps the norms: they tell it which rows are not finite
            if by_value:
                fused.clip_value(float(gradient_clip_val))  # type: ignore[arg-type]
            else:
                fused.clip_norm(float(gradient_clip_val))  # type: ignore[arg-type]
            return
        params = list(group.params.values())
        if by_value:
            clip_grad_value_per_trial(params, float(gradient_clip_val))  # type: ignore[arg-type]
        else:
            clip_grad_norm_per_trial(params, float(gradient_clip_val))  # type: ignore[arg-type]
        return
    trials = list(zip(group.trial_ids, group.modules))
    group.distribute_grads()
    for tid, module in trials:
        module.configure_gradient_clipping(  # type: ignore[operator]
            optimizer.trials[tid].optimizer,
            gradient_clip_val=gradient_clip_val,
            gradient_clip_algorithm=gradient_clip_algorithm,
        )
    if optimizer.active_path == "fused":
        group.clear_trial_grads()  # the fused update reads the stacked gradients; drop the views
