"""The Trainer as one trial of a fused group looks to a Lightning callback that acts on that trial alone.

:mod:`lightning_hydro.fused.lightning.callbacks` runs one copy of the user's ``ModelCheckpoint`` / ``EarlyStopping`` /
``LearningRateMonitor`` per trial and calls its hooks with a :class:`CallbackTrainerView`. Besides what any
trial's view answers (:class:`~lightning_hydro.fused.lightning.trainer_view.TrialTrainerView`: the trial module, its own
metrics under their unfused names), this view

- records ``trainer.should_stop = True`` as a request to stop this trial (the group stops the trial through
  its slot; the fit goes on while other trials run);
- writes ``trainer.save_checkpoint(path)`` as a checkpoint of the trial's own module, in Lightning's format,
  so that the user's class loads it with ``load_from_checkpoint`` as a checkpoint of the trial trained alone;
- answers ``optimizers`` / ``lr_scheduler_configs`` with the trial's own optimizers and schedulers (as any trial's
  view does);
- logs through ``loggers`` under ``"{name}/trial_{id}"``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from lightning_hydro.fused.lightning.strategy_view import TrialOptimizerSource
from lightning_hydro.fused.lightning.trainer_view import TrialTrainerView

if TYPE_CHECKING:
    from lightning_hydro.fused.module import FusedLightningModule

__all__ = [
    "TRIAL_CHECKPOINT_KEY",
    "CallbackTrainerView",
    "LogBuffer",
    "TrialCopies",
    "TrialLogger",
    "clone_tensors",
    "hyperparameter_entries",
    "trial_checkpoint",
]

TRIAL_CHECKPOINT_KEY = "lightning_hydro_trial"
"""Marks a trial's own checkpoint (``{"trial_id": id}``), so that a fused group given one restores the group."""


# What per-trial copies of a callback logged in one round, by real logger: (logger, step, metrics).
LogBuffer = dict[int, tuple[Any, "int | None", dict[str, float]]]


class TrialLogger:
    """A logger that logs a trial's metrics under ``"{name}/trial_{id}"``; everything else is the real logger's.

    With a ``buffer``, metrics are collected there instead, so that one round over the trials makes one
    ``log_metrics`` call per logger (one row of a CSV file, not one per trial).
    """

    def __init__(self, logger: Any, trial_id: int, buffer: LogBuffer | None = None) -> None:
        self._logger = logger
        self._suffix = f"/trial_{trial_id}"
        self._buffer = buffer

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Log (or collect) ``metrics`` with the trial's suffix."""
        renamed = {f"{name}{self._suffix}": value for name, value in metrics.items()}
        if self._buffer is None:
            self._logger.log_metrics(renamed, step=step)
            return
        self._buffer.setdefault(id(self._logger), (self._logger, step, {}))[2].update(renamed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._logger, name)


def clone_tensors(value: Any) -> Any:
    """Tensors cloned (a trial's tensors are views of the group's: saving a view would save every trial)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: clone_tensors(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clone_tensors(v) for v in value]
    return value


def hyperparameter_entries(module: L.LightningModule) -> dict[str, Any]:
    """What Lightning's checkpoint of ``module`` holds of its ``save_hyperparameters`` (nothing if it saved none)."""
    if not module.hparams:
        return {}
    entries: dict[str, Any] = {module.CHECKPOINT_HYPER_PARAMS_KEY: dict(module.hparams)}
    if hasattr(module, "_hparams_name"):
        entries[module.CHECKPOINT_HYPER_PARAMS_NAME] = module._hparams_name
    return entries


def trial_checkpoint(
    module: L.LightningModule,
    trial_id: int,
    trainer: L.Trainer,
    source: TrialOptimizerSource,
    *,
    weights_only: bool = False,
) -> dict[str, Any]:
    """A Lightning checkpoint of the trial's own module, as its unfused run's ``trainer.save_checkpoint`` writes it.

    Holds the epoch, the global step, the weights, the hyperparameters saved by ``save_hyperparameters`` and
    what the module's ``on_save_checkpoint`` adds; unless ``weights_only``, also the trial's optimizer and LR
    scheduler states while the trial runs (a trial that has left its slot has none any more). An entry
    :data:`TRIAL_CHECKPOINT_KEY` names the trial (``load_from_checkpoint`` ignores it).

    Args:
        module: the trial's module.
        trial_id: its id.
        trainer: the Trainer that fits the fused group.
        source: where the trial's optimizers are kept (the fused module's ``TrialOptimizers``).
        weights_only: as for ``trainer.save_checkpoint``.
    """
    checkpoint: dict[str, Any] = {
        "epoch": trainer.current_epoch,
        "global_step": trainer.global_step,
        "pytorch-lightning_version": L.__version__,
        "state_dict": clone_tensors(module.state_dict()),
        TRIAL_CHECKPOINT_KEY: {"trial_id": trial_id},
    }
    states = None if weights_only else source.checkpoint_states(trial_id, clone_tensors)
    if states is not None:
        checkpoint["optimizer_states"], checkpoint["lr_schedulers"] = states
    checkpoint.update(hyperparameter_entries(module))
    module.on_save_checkpoint(checkpoint)
    return checkpoint


class CallbackTrainerView(TrialTrainerView):
    """The Trainer as a per-trial copy of a Lightning callback sees it (see the module docstring).

    Args:
        trainer: the Trainer that fits the fused module.
        fused: the fused module.
        trial_id: the trial.
        log_buffer: if given, what is logged through ``loggers`` is collected there (see :class:`TrialLogger`).
    """

    _stop: bool
    _log_buffer: LogBuffer | None

    def __init__(
        self, trainer: L.Trainer, fused: FusedLightningModule, trial_id: int, log_buffer: LogBuffer | None = None
    ) -> None:
        super().__init__(trainer, fused.trial_module(trial_id), trial_id, fused.optimizer_source)
        object.__setattr__(self, "_stop", False)
        object.__setattr__(self, "_log_buffer", log_buffer)

    @property
    def should_stop(self) -> bool:
        """Whether the callback asked to stop this trial."""
        return self._stop

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        object.__setattr__(self, "_stop", bool(value))

    @property
    def loggers(self) -> list[Any]:
        """The Trainer's loggers, logging under ``"{name}/trial_{id}"``."""
        return [TrialLogger(logger, self._trial_id, self._log_buffer) for logger in self._trainer.loggers]

    @property
    def logger(self) -> Any:
        """The first of :attr:`loggers`, or None."""
        loggers = self.loggers
        return loggers[0] if loggers else None

    def save_checkpoint(
        self, filepath: Any, weights_only: bool | None = False, storage_options: Any | None = None
    ) -> None:
        """Write a checkpoint of the trial's own module (:func:`trial_checkpoint`) to ``filepath``."""
        source = self._source
        assert source is not None  # a callback's view always has the group's optimizers
        checkpoint = trial_checkpoint(
            self._trial, self._trial_id, self._trainer, source, weights_only=bool(weights_only)
        )
        self._trainer.strategy.save_checkpoint(checkpoint, filepath, storage_options=storage_options)
        self._trainer.strategy.barrier("Trainer.save_checkpoint")

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "should_stop":
            object.__setattr__(self, "_stop", bool(value))
            return
        super().__setattr__(name, value)


class TrialCopies:
    """One copy of a user callback per trial, made when a hook first meets the trial.

    Each copy's hooks are called with the Trainer as its trial sees it (:class:`CallbackTrainerView`); states of
    copies not yet made (after a resume) wait in ``pending_states``.

    Args:
        template: the user's callback.
        prepare: adapts a fresh copy to its trial (e.g. its own checkpoint directory) before its ``setup``.
    """

    def __init__(self, template: Callback, prepare: Callable[[Callback, int], None] | None = None) -> None:
        self.template = template
        self.prepare = prepare
        self.copies: dict[int, Callback] = {}
        self.pending_states: dict[int, dict[str, Any]] = {}
        self.stage: str | None = None

    def get(self, trial_id: int, view: CallbackTrainerView) -> Callback:
        """The trial's copy (made, set up and restored on first use)."""
        if trial_id not in self.copies:
            callback = copy.deepcopy(self.template)
            if self.prepare is not None:
                self.prepare(callback, trial_id)
            if self.stage is not None:
                callback.setup(view, view.lightning_module, self.stage)  # type: ignore[arg-type]
            if trial_id in self.pending_states:
                callback.load_state_dict(self.pending_states.pop(trial_id))
            self.copies[trial_id] = callback
        return self.copies[trial_id]

    def run(
        self, trainer: L.Trainer, fused: FusedLightningModule, trial_ids: Sequence[int]
    ) -> Iterator[tuple[int, Callback, CallbackTrainerView]]:
        """``(trial id, its copy, its view)`` for each of ``trial_ids``."""
        for tid in trial_ids:
            view = CallbackTrainerView(trainer, fused, tid)
            yield tid, self.get(tid, view), view

    def state_dict(self) -> dict[int, dict[str, Any]]:
        """Every trial's copy's state (made or pending), by trial id."""
        return {**self.pending_states, **{tid: c.state_dict() for tid, c in self.copies.items()}}
