"""Lightning's own callbacks, configured with the keys of an unfused run, act per trial in a fused group.

A user who trains one model writes ``ModelCheckpoint(monitor="val/acc")``, ``EarlyStopping(monitor="val/acc")``
and ``LearningRateMonitor()``. A fused group logs ``"val/acc/trial_{id}"``, so these callbacks, unchanged,
find no ``"val/acc"``. At fit start (``FusedLightningModule.configure_callbacks``) :func:`per_trial_callbacks`
replaces each of them by a group version that runs one copy of the user's callback per trial, its hooks
called with the Trainer as that trial sees it (:class:`~.callback_view.CallbackTrainerView`); one adapter per file,
as in Lightning's own callbacks package:

- :class:`~.model_checkpoint.TrialModelCheckpoint`: each trial's copy keeps that trial's best/last
  checkpoints in ``{dirpath}/trial_{id}/``, written as checkpoints of the trial's own module
  (``MyModule.load_from_checkpoint`` loads them); the group's own checkpoint goes to ``{dirpath}/`` (the latest
  epoch, and ``last.ckpt`` with ``save_last``), to resume the group; ``best_model_path`` (of
  ``trainer.checkpoint_callback`` and of the user's own callback object) names the best trial's own checkpoint.
- :class:`~.early_stopping.TrialEarlyStopping`: each trial's copy decides on the trial's own metric and patience;
  a trial it stops leaves its slot (``stop_trial``); the fit ends when no trial is left.
- :class:`~.learning_rate_monitor.TrialLearningRateMonitor`: logs each trial's learning rates as
  ``"lr-Adam/trial_{id}"``.

Callbacks configured with an explicit per-trial key (``monitor="val/acc/trial_2"``) or, for ``ModelCheckpoint``,
no monitor, act on the group as before. Callbacks that cannot act per trial raise
:class:`CallbackNotPerTrialError` at fit start.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import lightning as L
from lightning.pytorch.callbacks import (
    BaseFinetuning,
    BatchSizeFinder,
    Callback,
    EarlyStopping,
    LearningRateFinder,
    LearningRateMonitor,
    ModelCheckpoint,
    ModelPruning,
    StochasticWeightAveraging,
)
from lightning.pytorch.utilities.model_helpers import is_overridden

from lightning_hydro.fused.lightning.early_stopping import TrialEarlyStopping
from lightning_hydro.fused.lightning.learning_rate_monitor import TrialLearningRateMonitor
from lightning_hydro.fused.lightning.model_checkpoint import TrialModelCheckpoint

__all__ = ["CallbackNotPerTrialError", "per_trial_callbacks", "refuse_module_callbacks"]

_TRIAL_KEY = re.compile(r"/trial_\d+$")
_GROUP_KEYS = {"trials", "stopped", "diverged"}  # what the fused module itself logs

# Callbacks that act on the one LightningModule or its one optimizer as a whole: why, and what to do instead.
_NOT_PER_TRIAL: dict[type[Callback], str] = {
    StochasticWeightAveraging: (
        "it averages the weights of the whole fused model and replaces the optimizer's learning-rate schedule for "
        "every trial at once. Train the chosen trial with SWA after the sweep (FusedLightningModule.unfuse(id))"
    ),
    LearningRateFinder: (
        "it searches one learning rate for the whole group, while each trial has its own. Make the learning rate "
        "a swept hyperparameter (one trial per value), or run the finder on one unfused trial"
    ),
    BatchSizeFinder: (
        "the trials of a group share each batch, and it would size it from the whole group's memory. Pass the "
        "batch size to the data module (the sweeper sizes groups from measured memory)"
    ),
    BaseFinetuning: (
        "it freezes and unfreezes submodules of the LightningModule (the fused wrapper has none of the trial's "
        "attributes) and adds parameter groups to the one optimizer. Freeze and unfreeze layers in the trial "
        "module's own hooks (self.backbone.requires_grad_(...) in on_train_epoch_start), which run per trial, with "
        "every parameter in the optimizer configure_optimizers returns (a frozen one gets no step)"
    ),
    ModelPruning: (
        "it prunes the stacked tensors with one threshold over all trials, coupling them. Prune the chosen trial "
        "after the sweep (FusedLightningModule.unfuse(id))"
    ),
}


class CallbackNotPerTrialError(ValueError):
    """A callback passed to the Trainer of a fused group cannot act per trial."""


def _is_unfused_key(monitor: str | None) -> bool:
    return monitor is not None and not _TRIAL_KEY.search(monitor) and monitor not in _GROUP_KEYS


def refuse_module_callbacks(trial: L.LightningModule) -> None:
    """Refuse callbacks that a trial module returns from ``configure_callbacks``.

    Each trial would return its own (their settings may follow its hyperparameters), and Lightning takes
    them from the one LightningModule it fits: the fused wrapper. Rather than act on one trial's settings
    for all, fusion asks for them on the Trainer, where they act per trial.

    Raises:
        CallbackNotPerTrialError: the trial's class overrides ``configure_callbacks``.
    """
    if is_overridden("configure_callbacks", trial, L.LightningModule):
        raise CallbackNotPerTrialError(
            f"{type(trial).__name__}.configure_callbacks() returns callbacks, which a FusedLightningModule does not "
            "take from its trials (each trial would bring its own). Pass those callbacks to the Trainer instead: "
            "Lightning's ModelCheckpoint, EarlyStopping and LearningRateMonitor then act per trial."
        )


def per_trial_callbacks(callbacks: Sequence[Callback]) -> list[Callback]:
    """``callbacks`` with each one configured for an unfused run replaced by its per-trial group version.

    Raises:
        CallbackNotPerTrialError: a callback that cannot act per trial (the message names it and what to use).

    Example::

        >>> from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
        >>> [type(c).__name__ for c in per_trial_callbacks(
        ...     [ModelCheckpoint(monitor="val/acc"), EarlyStopping(monitor="val/acc/trial_2")])]
        ['TrialModelCheckpoint', 'EarlyStopping']
    """
    result: list[Callback] = []
    for callback in callbacks:
        for kind, why in _NOT_PER_TRIAL.items():
            if isinstance(callback, kind):
                raise CallbackNotPerTrialError(
                    f"{type(callback).__name__} was passed to the Trainer of a FusedLightningModule, but it cannot "
                    f"act per trial: {why}; or remove it from the Trainer's callbacks."
                )
        if isinstance(callback, (TrialModelCheckpoint, TrialEarlyStopping, TrialLearningRateMonitor)):
            result.append(callback)  # already per trial (a second fit, validate or test)
        elif isinstance(callback, ModelCheckpoint) and _is_unfused_key(callback.monitor):
            result.append(TrialModelCheckpoint(callback))
        elif isinstance(callback, EarlyStopping) and _is_unfused_key(callback.monitor):
            result.append(TrialEarlyStopping(callback))
        elif isinstance(callback, LearningRateMonitor):
            result.append(TrialLearningRateMonitor(callback))
        else:
            result.append(callback)
    return result
