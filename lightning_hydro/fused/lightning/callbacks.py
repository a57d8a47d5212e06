"""Lightning's own callbacks, configured with the keys of an unfused run, act per trial in a fused group.

A user who trains one model writes ``ModelCheckpoint(monitor="val/acc")``, ``EarlyStopping(monitor="val/acc")``
and ``LearningRateMonitor()``. A fused group logs ``"val/acc/trial_{id}"``, so these callbacks, unchanged,
find no ``"val/acc"``. At fit start (``FusedLightningModule.configure_callbacks``) :func:`per_trial_callbacks`
replaces each of them by a group version that runs one copy of the user's callback per trial, its hooks
called with the Trainer as that trial sees it (:class:`~.callback_view.CallbackTrainerView`):

- :class:`~.model_checkpoint.TrialModelCheckpoint`: each trial's copy keeps that trial's best/last
  checkpoints in ``{dirpath}/trial_{id}/``, written as checkpoints of the trial's own module
  (``MyModule.load_from_checkpoint`` loads them); the group's own checkpoint goes to ``{dirpath}/`` (the latest
  epoch, and ``last.ckpt`` with ``save_last``), to resume the group; ``best_model_path`` (of
  ``trainer.checkpoint_callback`` and of the user's own callback object) names the best trial's own checkpoint.
- :class:`TrialEarlyStopping`: each trial's copy decides on the trial's own metric and patience; a trial
  it stops leaves its slot (``stop_trial``); the fit ends when no trial is left.
- :class:`TrialLearningRateMonitor`: logs each trial's learning rates as ``"lr-Adam/trial_{id}"``.

Callbacks configured with an explicit per-trial key (``monitor="val/acc/trial_2"``) or, for ``ModelCheckpoint``,
no monitor, act on the group as before. Callbacks that cannot act per trial raise
:class:`CallbackNotPerTrialError` at fit start.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
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
from typing_extensions import override

from lightning_hydro.fused.lightning.callback_view import CallbackTrainerView, LogBuffer, TrialCopies
from lightning_hydro.fused.lightning.model_checkpoint import TrialModelCheckpoint

__all__ = [
    "CallbackNotPerTrialError",
    "TrialEarlyStopping",
    "TrialLearningRateMonitor",
    "TrialModelCheckpoint",
    "per_trial_callbacks",
    "refuse_module_callbacks",
]

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
        "attributes) and adds parameter groups to the one optimizer. Freeze layers in the trial module's own "
        "hooks (on_train_epoch_start), which run per trial"
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


class TrialEarlyStopping(EarlyStopping):
    """The user's ``EarlyStopping`` per trial: a copy per trial stops that trial through its slot.

    As in an unfused run, a stop decided before ``Trainer(min_epochs=..., min_steps=...)`` is reached waits until
    it is; the fit stops when every trial has stopped (or at its own limits).

    Args:
        template: the user's ``EarlyStopping``; each trial's copy has its settings.
    """

    def __init__(self, template: EarlyStopping) -> None:
        super().__init__(monitor=template.monitor, patience=template.patience, mode=template.mode)
        self.template = template
        self._trials = TrialCopies(template)
        self._pending_stops: dict[int, str] = {}

    @property
    def trial_callbacks(self) -> dict[int, EarlyStopping]:
        """Each trial's ``EarlyStopping``, by trial id (``wait_count``, ``best_score``, ``stopped_epoch``)."""
        return dict(self._trials.copies)  # type: ignore[arg-type]

    def _check(self, trainer: L.Trainer, fused: Any, hook: str) -> None:
        for tid, callback, view in self._trials.run(trainer, fused, fused.trial_ids):
            getattr(callback, hook)(view, view.lightning_module)
            if view.should_stop and tid not in self._pending_stops:
                reason = getattr(callback, "stopping_reason_message", None) or "no improvement"
                self._pending_stops[tid] = f"EarlyStopping(monitor={self.monitor!r}): {reason}"
        if self._pending_stops and _may_stop_early(trainer):
            for tid, reason in list(self._pending_stops.items()):
                if tid in fused.trial_ids:
                    fused.stop_trial(tid, reason)
            self._pending_stops.clear()
            if not fused.trial_ids:
                self.stopped_epoch = trainer.current_epoch
                if hook == "on_train_epoch_end":
                    # Lightning runs EarlyStopping's on_train_epoch_end after the module's, where the group ends
                    # its fit once no trial runs: end it here, as EarlyStopping ends an unfused fit
                    trainer.should_stop = True

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._trials.stage = stage

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check(trainer, pl_module, "on_train_epoch_end")

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check(trainer, pl_module, "on_validation_end")

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "trials": self._trials.state_dict(), "pending_stops": self._pending_stops}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        self._trials.pending_states.update(state.pop("trials", {}))
        self._pending_stops = dict(state.pop("pending_stops", {}))
        super().load_state_dict(state)


def _may_stop_early(trainer: L.Trainer) -> bool:
    """Lightning's rule: ``should_stop`` takes effect once ``min_epochs`` and ``min_steps`` are reached."""
    min_epochs, min_steps = trainer.fit_loop.min_epochs, trainer.fit_loop.min_steps
    epochs_done = trainer.current_epoch + 1  # the check runs at the end of the current epoch
    return (not min_epochs or epochs_done >= min_epochs) and (not min_steps or trainer.global_step >= min_steps)


class TrialLearningRateMonitor(LearningRateMonitor):
    """The user's ``LearningRateMonitor`` per trial: each trial's rates logged as ``"lr-Adam/trial_{id}"``.

    Names follow Lightning's (the scheduler's ``name``, ``-pg{i}`` per parameter group, ``-momentum``), suffixed
    with the trial; the values also go into ``trainer.callback_metrics`` under those names.

    Args:
        template: the user's ``LearningRateMonitor``; each trial's copy has its settings.
    """

    def __init__(self, template: LearningRateMonitor) -> None:
        super().__init__(
            logging_interval=template.logging_interval,
            log_momentum=template.log_momentum,
            log_weight_decay=template.log_weight_decay,
        )
        self.template = template
        self._trials = TrialCopies(template)
        self._started: set[int] = set()

    def _each_trial(self, trainer: L.Trainer, fused: Any, hook: str) -> None:
        buffer: LogBuffer = {}
        for tid in fused.trial_ids:
            view = CallbackTrainerView(trainer, fused, tid, log_buffer=buffer)
            callback = self._trials.get(tid, view)
            if tid not in self._started:  # a trial that joined after the start: name its rates first
                callback.on_train_start(view, view.lightning_module)  # type: ignore[arg-type]
                self._started.add(tid)
            if hook != "on_train_start":
                getattr(callback, hook)(view, view.lightning_module)
        for logger, step, metrics in buffer.values():
            logger.log_metrics(metrics, step=step)
            device = trainer.strategy.root_device  # where Lightning's own monitor puts them
            trainer.callback_metrics.update(
                {name: torch.as_tensor(value, device=device) for name, value in metrics.items()}
            )

    @override
    def on_train_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        self._each_trial(trainer, trainer.lightning_module, "on_train_start")

    @override
    def on_train_batch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        self._each_trial(trainer, trainer.lightning_module, "on_train_batch_start")

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        self._each_trial(trainer, trainer.lightning_module, "on_train_epoch_start")
