"""The trials' own hooks in a fused group: which run per trial, and which hooks the group has.

Epoch- and fit-level hooks that the trial modules implement run per trial (:func:`forward_hook`), their
``self.log`` calls recorded as that trial's epoch values (what a fused step logs is booked by
:meth:`lightning_hydro.fused.logging.metrics.TrialMetrics.record_step`). Steps and data hooks
the trials do not implement are hidden on the fused module (:func:`hide_absent_hooks`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import lightning as L
import torch
from lightning.pytorch.trainer.connectors.logger_connector.fx_validator import _FxValidator
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor

from lightning_hydro.backends.errors import ESCAPED_TENSOR_MESSAGES, escaped_tensor_error
from lightning_hydro.backends.python_state import trial_code_ran
from lightning_hydro.backends.trial_logging import capture_logs, logged_dtype
from lightning_hydro.fused.lightning.trainer_view import own_hook
from lightning_hydro.fused.logging.metrics import TrialMetrics, resolve_options

__all__ = [
    "EPOCH_END_HOOKS",
    "FORWARDED_HOOKS",
    "OPTIONAL_HOOKS",
    "call_trial_hook",
    "forward_hook",
    "hide_absent_hooks",
]

# Epoch- and fit-level hooks forwarded to every running trial that overrides them (with its logging captured).
FORWARDED_HOOKS = {
    "on_fit_start": None,
    "on_train_start": None,
    "on_train_epoch_start": "train",
    "on_train_epoch_end": "train",
    "on_validation_epoch_start": "validate",
    "on_validation_epoch_end": "validate",
    "on_test_epoch_start": "test",
    "on_test_epoch_end": "test",
    "on_train_end": None,
    "on_fit_end": None,
    # the modes around evaluation (the fused module applies Lightning's default to the trials that do not override)
    "on_validation_model_eval": None,
    "on_validation_model_train": None,
    "on_test_model_eval": None,
    "on_test_model_train": None,
    "on_predict_model_eval": None,
}

# The epoch-end hooks among them, by the phase whose epoch values Lightning holds in the Trainer's metrics when
# they run (alone, it reduces the epoch's logged values before the module's hook).
EPOCH_END_HOOKS = {"on_train_epoch_end": "train", "on_validation_epoch_end": "validate", "on_test_epoch_end": "test"}

# Hooks of the trial modules that the fused module exposes only if the trials implement them, so that
# Lightning sees the same loops as in an unfused run (e.g. no validation loop without a validation_step).
OPTIONAL_HOOKS = (
    "validation_step",
    "test_step",
    "train_dataloader",
    "val_dataloader",
    "test_dataloader",
    "predict_dataloader",
)


def hide_absent_hooks(fused: L.LightningModule, trial: L.LightningModule) -> None:
    """Hide each of :data:`OPTIONAL_HOOKS` that ``trial`` does not implement from Lightning on ``fused``."""
    for hook in OPTIONAL_HOOKS:
        if not is_overridden(hook, trial, L.LightningModule):
            fused.__dict__[hook] = None  # Lightning's is_overridden() then reports False


def _as_value(value: Any) -> tuple[float, torch.dtype]:
    """A value an epoch-end hook logged (a tensor, number or torchmetrics Metric), and Lightning's dtype for it."""
    if hasattr(value, "compute") and hasattr(value, "reset"):  # a torchmetrics Metric
        value = value.compute()
    return float(value.detach().reshape(()) if isinstance(value, Tensor) else value), logged_dtype([value])


def call_trial_hook(hook: str, trial_id: int, module: Any, *args: Any, shared: bool = False) -> tuple[Any, list[Any]]:
    """``module.hook(*args)`` with its ``self.log`` calls captured; returns (its answer, the calls).

    ``shared``: the call stands for every trial's (a batch-transfer hook run once): its ``trainer.should_stop``
    is the group's. Otherwise it is the trial's own (:class:`~.trainer_view.TrialStopRequests`).

    A vmap/hfta tensor the trial kept from a fused step and uses here is explained (``FusionError``), not left as
    torch's internal error.
    """
    with capture_logs(module) as calls, nullcontext() if shared else own_hook(trial_id, hook):
        try:
            answer = getattr(module, hook)(*args)
        except RuntimeError as err:
            if not any(needle in str(err) for needle in ESCAPED_TENSOR_MESSAGES):
                raise
            where = f"{type(module).__name__}.{hook} of trial {trial_id}"
            raise escaped_tensor_error(err, backend="vmap'/'hfta", where=where) from err
    for call in calls:  # Lightning's own rule of where what may be logged, as it checks a module's self.log alone
        _FxValidator.check_logging_and_get_default_levels(
            hook, on_step=call.options.get("on_step"), on_epoch=call.options.get("on_epoch")
        )
    return answer, calls


def forward_hook(hook: str, running: Sequence[tuple[int, Any]], metrics: TrialMetrics) -> None:
    """Run ``hook`` of every running trial that overrides it; record what it logs as the trial's epoch values."""
    phase = FORWARDED_HOOKS[hook]
    trial_code_ran()  # the hooks may change each trial's Python state its own way
    for tid, module in running:
        if not is_overridden(hook, module, L.LightningModule):
            continue
        _, calls = call_trial_hook(hook, tid, module)
        if phase is not None:
            for call in calls:
                options = resolve_options(hook, call.options) if call.options.get("sync_dist") else None
                value, dtype = _as_value(call.value)
                metrics.record_epoch_value(phase, call.name, {tid: value}, options, dtype)
