"""Checks of ``FusedLightningModule``'s arguments, with messages that say what came and how to fix it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
from lightning.pytorch.utilities.model_helpers import is_overridden

from lightning_hydro.backends import BACKEND_NAMES, FusionError

__all__ = ["check_deterministic", "check_fused_arguments", "check_precision"]


# Hooks of the optimizer step that a fused group runs once for every trial (so a trial's override would be skipped),
# with what the refusal says after the hook's name
_GROUP_OPTIMIZER_HOOKS = {
    "optimizer_zero_grad": (
        ", which a fused group does not call per trial: the group optimizer clears every trial's gradients at once "
        "(it sets them to None), so the override would be skipped. Remove it, or, to accumulate gradients over "
        "batches, use Trainer(accumulate_grad_batches=...), which a fused group honours."
    ),
}


def check_fused_arguments(
    trials: Sequence[Any], ids: Sequence[int], backend: str, max_slots: int | None, optimizer_path: str, mode: str
) -> None:
    """Raise ``ValueError``/``TypeError`` for arguments a fused group cannot work with."""
    if not trials:
        raise ValueError("FusedLightningModule needs at least one trial module, got an empty list.")
    for index, trial in enumerate(trials):
        if not isinstance(trial, L.LightningModule):
            raise TypeError(
                f"FusedLightningModule: trial {index} is a {type(trial).__name__}, expected a "
                "lightning.LightningModule (wrap plain nn.Modules in a LightningModule)."
            )
    manual = [index for index, trial in enumerate(trials) if not trial.automatic_optimization]
    if manual and len(manual) != len(trials):
        raise ValueError(
            f"FusedLightningModule: trials {manual} use manual optimization (automatic_optimization = False) and the "
            "others automatic optimization; a group runs one kind of training step. Fuse them in separate groups."
        )
    skipped = [
        hook for hook in _GROUP_OPTIMIZER_HOOKS if not manual and is_overridden(hook, trials[0], L.LightningModule)
    ]
    if skipped:
        hook = skipped[0]
        raise ValueError(
            f"FusedLightningModule: {type(trials[0]).__name__} overrides {hook}{_GROUP_OPTIMIZER_HOOKS[hook]}"
        )
    if manual and backend in ("vmap", "hfta"):
        raise FusionError(
            f"FusedLightningModule(backend={backend!r}): {type(trials[0]).__name__} uses manual optimization "
            "(automatic_optimization = False): its training_step calls manual_backward and opt.step() itself, which "
            "runs per trial only on backend='loop' (each trial's step in turn, with its own optimizers); under "
            f"{backend} one call runs every trial's step at once, and a backward or an optimizer step cannot run "
            "inside it. Use backend='loop', or backend='auto', which chooses 'loop' for manual optimization."
        )
    if len({id(t) for t in trials}) != len(trials):
        raise ValueError("FusedLightningModule: the same module object appears twice; pass distinct trials.")
    if len(ids) != len(trials) or len(set(ids)) != len(ids):
        raise ValueError(
            f"FusedLightningModule: trial_ids must be {len(trials)} distinct integers, one per trial, got {list(ids)}."
        )
    if backend not in BACKEND_NAMES:
        choices = ", ".join(repr(b) for b in BACKEND_NAMES)
        raise ValueError(f"FusedLightningModule: unknown backend {backend!r}; expected one of {choices}.")
    if max_slots is not None and max_slots < len(trials):
        raise ValueError(f"FusedLightningModule: max_slots={max_slots} is less than the {len(trials)} trials given.")
    if optimizer_path not in ("auto", "universal", "fused"):
        raise ValueError(
            f"FusedLightningModule: optimizer_path must be 'auto', 'universal' or 'fused', got {optimizer_path!r}."
        )
    if mode not in ("min", "max"):
        raise ValueError(f"FusedLightningModule: mode must be 'min' or 'max', got {mode!r}.")


def check_deterministic(deterministic: Any) -> bool:
    """``deterministic`` must be a bool (a string such as ``"false"`` from a config would read as true)."""
    if not isinstance(deterministic, bool):
        raise TypeError(
            f"FusedLightningModule: deterministic must be True or False, got {deterministic!r}; "
            "e.g. deterministic=True to choose backend='auto' without timing."
        )
    return deterministic


def check_precision(precision: Any) -> None:
    """The Trainer's precision must not scale the loss: one shared GradScaler would couple the trials."""
    precision = str(precision)
    if precision in ("16-mixed", "16", "16-mixed-amp"):
        raise ValueError(
            f"FusedLightningModule does not support precision={precision!r}: its one shared GradScaler would "
            "skip every trial's step whenever one trial overflows, coupling the trials. Use "
            "precision='bf16-mixed' (no loss scaling needed), '32-true' or '16-true'."
        )
