"""``TrialPublisher``: what a fused group tells Lightning's loggers and progress bar, per trial.

A fused step returns each metric the user's step logged as a ``[B]`` tensor (or per-trial metric objects);
:meth:`~lightning_hydro.fused.logging.metrics.TrialMetrics.record_step` books them under Lightning's options, on the
device, per trial. The publisher hands them on under Lightning's names (:mod:`.names`: ``"loss_step"``,
``"loss_epoch"``, ``"val_loss/dataloader_idx_1"``) with ``"/trial_{id}"`` last:

- training step values into ``trainer.callback_metrics`` and ``trainer.logged_metrics`` after every training step
  (0-dim views of the device rows: nothing is read), and to the loggers every ``log_every_n_steps``;
- evaluation step values (``on_step=True`` in a validation or test step) through the fused module's ``self.log``
  at the batch's end, so that Lightning logs them at its evaluation step, as for one module;
- epoch values through the fused module's ``self.log`` (so that callbacks and LR schedulers monitoring
  ``"val_loss/trial_3"`` see them) and into each trial's record;
- the count of running, stopped and diverged trials on the progress bar (the trials' own values stay off it: a
  group of many trials would fill it).

After ``fit``, ``validate`` and ``test``, :meth:`TrialPublisher.publish_chosen_trial` also puts one trial's values under
the unfused names (``"val/acc"``) into ``trainer.callback_metrics`` and ``trainer.logged_metrics``, for code that
reads a metric back after the fit as for one model (lightning-hydra-template's ``train.py``, which returns
``trainer.callback_metrics[cfg.optimized_metric]``): the group's best trial by ``monitor`` and ``mode``
(:func:`chosen_trial`), each name with the value its record holds (the same as ``results[id]["metrics"]``).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Mapping
from typing import Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn

from lightning_hydro.fused.group.book import TrialBook
from lightning_hydro.fused.group.slots import TrialSlots
from lightning_hydro.fused.logging.metrics import StepValue, TrialMetrics
from lightning_hydro.fused.logging.names import LightningNames
from lightning_hydro.stopping.trial_record import TrialRecord, best_trial

__all__ = ["LogFunction", "TrialPublisher", "chosen_trial"]

LogFunction = Callable[..., None]  # LightningModule.log of the fused module


class TrialPublisher:
    """Books each step's per-trial logs and publishes them to Lightning.

    Args:
        slots: the group's slots (which trial each row is, every trial's record).
        metrics: the per-trial metrics of the current step and epoch.
    """

    def __init__(self, slots: TrialSlots, metrics: TrialMetrics) -> None:
        self.slots = slots
        self.metrics = metrics
        self._counts: tuple[int, dict[str, int]] | None = None  # (the book's changes, its counts then)
        self._put: list[StepValue] = []  # the training step values last put into the Trainer's metrics
        # each step value's keys per trial (callback_metrics keys, logged_metrics key), by its names object, with
        # the names, trial ids and logger option they were made for
        self._keys: dict[int, tuple[LightningNames, list[int], bool, list[tuple[str, str, str | None]]]] = {}

    @property
    def book(self) -> TrialBook:
        """Every trial's record."""
        return self.slots.book

    def put_step_values(self, trainer: L.Trainer) -> None:
        """After each training step: its values into ``trainer.callback_metrics`` and ``logged_metrics``.

        Before Lightning's ``on_train_batch_end`` hooks, as alone (a callback's hook reads the step's own values).
        """
        steps = self.metrics.latest_steps("train")
        if not steps:
            return
        callback, logged = trainer.callback_metrics, trainer.logged_metrics
        for step in steps:
            values = step.values.reshape(len(step.trial_ids)).unbind(0)  # 0-dim views of the rows: nothing is read
            for (plain, step_name, to_logger), value in zip(self._keys_of(step), values):
                callback[plain] = callback[step_name] = value
                if to_logger is not None:
                    logged[to_logger] = value
        self._put = steps

    def _keys_of(self, step: StepValue) -> list[tuple[str, str, str | None]]:
        """The keys of a step value's trials: made once per name and group, not at every step."""
        names = step.names  # one object per name and loader (TrialMetrics makes each once)
        made = self._keys.get(id(names))
        if made is None or made[0] is not names or made[1] != step.trial_ids or made[2] != step.options.logger:
            keys = [
                (
                    f"{names.plain}/trial_{tid}",
                    f"{names.step}/trial_{tid}",
                    f"{names.step}/trial_{tid}" if step.options.logger else None,
                )
                for tid in step.trial_ids
            ]
            made = self._keys[id(names)] = (names, list(step.trial_ids), step.options.logger, keys)
        return made[3]

    def publish_step(self, trainer: L.Trainer, log: LogFunction) -> None:
        """After an optimizer step: step values to the Trainer's metrics and, when due, the loggers; counts to the bar.

        The Trainer's metrics get them again if the trials' own batch-end hooks logged more since the step.
        """
        latest, put = self.metrics.latest_steps("train"), self._put
        if len(latest) != len(put) or any(a is not b for a, b in zip(latest, put)):
            self.put_step_values(trainer)
        step = _logging_step(trainer)
        if trainer.loggers and _should_log_step(trainer, step):
            flat = {
                f"{name}/trial_{tid}": value
                for tid, values in self.metrics.step_values(logger_only=True).items()
                for name, value in values.items()
            }
            if flat:
                for logger in trainer.loggers:
                    logger.log_metrics(flat, step=step)
        if trainer.progress_bar_callback is not None:
            book = self.slots.book
            if self._counts is None or self._counts[0] != book.changes:  # counted again only after a change
                self._counts = (book.changes, book.counts())
            counts = self._counts[1]
            log("trials", float(counts["running"]), prog_bar=True, logger=False)
            for status in ("stopped", "diverged"):
                if counts[status]:
                    log(status, float(counts[status]), prog_bar=True, logger=False)

    def publish_epoch(self, phase: str, log: LogFunction, *, sanity_checking: bool) -> None:
        """Log each trial's epoch values as ``name/trial_{id}`` and keep them in the results.

        Under several processes a value the trial logged with ``sync_dist=True`` is the same on every rank (reduced
        by :class:`TrialMetrics`) and is logged with ``sync_dist=True`` again, as the trial asked; one logged without
        it is each rank's own, which a warning says once per name.
        """
        options = self.metrics.epoch_options(phase)
        values = self.metrics.finish_epoch(phase)
        if sanity_checking:
            return
        _warn_unsynced(self.metrics)
        for tid, metrics in values.items():
            self.book.record_metrics(tid, _with_epoch_names(metrics, self.metrics, phase))
            for name, value in metrics.items():
                synced = name in options and options[name].sync_dist and self.metrics.reduce is not None
                names = self.metrics.names_of(phase, name)
                # None means Lightning's default (True) without its warning when no logger is configured
                logger = None if name not in options or options[name].logger else False
                # a value logged on step and epoch: the loggers get "loss_epoch", callback_metrics "loss" too
                keys: tuple[tuple[str, bool | None], ...] = ((name, logger),)
                if names.forked:
                    keys = ((names.epoch, logger), (names.plain, False))
                logged: float | torch.Tensor = value
                if self.metrics.is_double(phase, name):  # as Lightning logs a float64 value's epoch value
                    logged = torch.tensor(value, dtype=torch.float64)
                for key, to_logger in keys:
                    log(
                        f"{key}/trial_{tid}",
                        logged,
                        on_step=False,
                        on_epoch=True,
                        logger=to_logger,
                        batch_size=1,
                        sync_dist=synced,
                        add_dataloader_idx=False,  # a loader's suffix is in the name already, before the trial's
                    )

    def put_epoch_values(self, trainer: L.Trainer, phase: str) -> None:
        """Before the trials' epoch-end hooks: the epoch's values so far into the Trainer's metrics, per trial.

        Alone, Lightning has reduced the epoch's logged values into ``trainer.callback_metrics`` (under the plain and
        the epoch name) and ``logged_metrics`` (the epoch name) when the module's ``on_train_epoch_end`` or
        ``on_validation_epoch_end`` runs, so a trial's hook reads this epoch's ``"loss_epoch"`` there.
        :meth:`publish_epoch` logs the same numbers after the hooks, with what the hooks log.
        """
        options = self.metrics.epoch_options(phase)
        callback, logged = trainer.callback_metrics, trainer.logged_metrics
        device = trainer.strategy.root_device
        for tid, values in self.metrics.epoch_so_far(phase).items():
            for name, value in values.items():
                names = self.metrics.names_of(phase, name)
                # the dtype self.log gives a Python float, or float64, as publish_epoch logs it
                dtype = torch.float64 if self.metrics.is_double(phase, name) else torch.get_default_dtype()
                tensor = torch.tensor(value, dtype=dtype, device=device)
                callback[f"{names.plain}/trial_{tid}"] = callback[f"{names.epoch}/trial_{tid}"] = tensor
                if name not in options or options[name].logger:
                    logged[f"{names.epoch}/trial_{tid}"] = tensor

    def publish_evaluation_step(self, phase: str, log: LogFunction) -> None:
        """At an evaluation batch's end: its step values (``on_step=True``), through the fused module's ``log``.

        Lightning then logs them to ``trainer.logged_metrics`` and the loggers at its evaluation step, as it logs a
        module's own (not to ``callback_metrics``: an evaluation step value never goes there). Only the values of
        the batch's dataloader: each loader's have their own names.
        """
        for step in self.metrics.latest_steps(phase):
            if not step.options.logger or step.dataloader_idx != self.metrics.dataloader_idx:
                continue
            for tid, value in step.per_trial().items():
                # the names carry the loader's suffix before the trial's already
                key = f"{step.names.step}/trial_{tid}"
                log(key, value, on_step=True, on_epoch=False, add_dataloader_idx=False, batch_size=1)

    def end_training_epoch(self, epoch: int, log: LogFunction, *, sanity_checking: bool) -> None:
        """At a training epoch's end: keep the last step values, publish the epoch, credit it to each running trial."""
        for tid, values in self.metrics.step_values().items():
            self.book.update_metrics(tid, values)
        self.publish_epoch("train", log, sanity_checking=sanity_checking)
        # a loader of unknown length has no recognisable last batch: the epoch is credited here instead
        self.book.end_epoch(epoch, self.slots.trial_ids)

    def publish_chosen_trial(
        self, trainer: L.Trainer, *, monitor: str | None, mode: Literal["min", "max"], stage: str
    ) -> int | None:
        """The chosen trial's values (:func:`chosen_trial`) under the unfused names; returns its id.

        Into ``trainer.callback_metrics`` and ``trainer.logged_metrics``, which Lightning keeps until the next
        stage starts; a name already there (logged by a callback on the group itself) is left as it is. Call it
        once the stage's values are recorded and Lightning's own updates are over (``on_fit_end``, and the end of
        ``validate`` and ``test``). The loggers get nothing new: they have each trial's values already.
        """
        records = self.book.records
        chosen = chosen_trial(records, monitor, mode)
        if chosen is None:
            if monitor is not None and records:
                logged = sorted({name for record in records.values() for name in record.metrics})
                rank_zero_warn(
                    f"FusedLightningModule: after {stage}, no trial has a finite value of monitor={monitor!r} (the "
                    f"trials logged {logged}), so trainer.callback_metrics holds each trial's values as "
                    f"'name/trial_<id>' only, none under the unfused names. Fix: monitor one of the logged names."
                )
            return None
        # float64: the very numbers of the trial's record (and so of results.json), whatever the logged dtype
        values = {name: torch.tensor(value, dtype=torch.float64) for name, value in records[chosen].metrics.items()}
        for metrics in (trainer.callback_metrics, trainer.logged_metrics):
            for name, value in values.items():
                metrics.setdefault(name, value)
        return chosen

    def training_epoch_values(self) -> dict[int, dict[str, float]]:
        """Each running trial's latest values, with this training epoch's values so far."""
        latest = {tid: dict(self.book.records[tid].metrics) for tid in self.slots.trial_ids}
        for source in (self.metrics.step_values(), self.metrics.epoch_so_far("train")):
            for tid, values in source.items():
                if tid in latest:
                    latest[tid].update(_with_epoch_names(values, self.metrics, "train"))
        return latest


def chosen_trial(records: Mapping[int, TrialRecord], monitor: str | None, mode: Literal["min", "max"]) -> int | None:
    """The trial whose values the unfused names stand for: the best finite ``monitor`` value (ties: the lowest id).

    Without ``monitor`` only a group of one trial has an answer; None where there is none (no trial, or no trial
    with a finite ``monitor`` value: all diverged, or the name was never logged).

    Example::

        >>> records = {0: TrialRecord(0, metrics={"val/acc": 0.5}), 1: TrialRecord(1, metrics={"val/acc": 0.75})}
        >>> chosen_trial(records, "val/acc", "max"), chosen_trial(records, "val/acc", "min")
        (1, 0)
        >>> chosen_trial(records, None, "max"), chosen_trial({4: records[0]}, None, "max")  # one trial: no doubt
        (None, 4)
    """
    if monitor is None:
        return next(iter(records)) if len(records) == 1 else None
    return best_trial(records, monitor, mode)


def _with_epoch_names(values: Mapping[str, float], metrics: TrialMetrics, phase: str) -> dict[str, float]:
    """A trial's epoch values with each value logged on step and epoch under its epoch name too (``"loss_epoch"``)."""
    out = dict(values)
    for name, value in values.items():
        out.setdefault(metrics.names_of(phase, name).epoch, value)
    return out


def _warn_unsynced(metrics: TrialMetrics) -> None:
    """Say once per name that an epoch value logged without ``sync_dist=True`` is each process's own."""
    for name in sorted(metrics.unsynced - _WARNED_UNSYNCED):
        _WARNED_UNSYNCED.add(name)
        rank_zero_warn(
            f"FusedLightningModule: the trials log {name!r} on epoch level without sync_dist=True under several "
            "processes, so each trial's value (its results, and early-stopping decisions on it) covers rank 0's "
            f"share of the data only. Fix: self.log({name!r}, ..., sync_dist=True) in the trial module.",
        )
        # Lightning would repeat its own advice for every trial's key of this name
        per_trial_key = rf"It is recommended to use `self\.log\('{re.escape(name)}/trial_\d+'"
        warnings.filterwarnings("ignore", message=per_trial_key)


_WARNED_UNSYNCED: set[str] = set()


def _logging_step(trainer: L.Trainer) -> int:
    """The step a batch's values are logged at, as Lightning numbers it: the batches that stepped before this one.

    (Lightning's own step logging reads the same counter, at the same point: the training batch's end.)
    """
    return int(getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", trainer.global_step))


def _should_log_step(trainer: L.Trainer, step: int) -> bool:
    """Lightning's rule: every ``log_every_n_steps`` batches that stepped, counting this one, and the last batch.

    The last: the one after which the fit stops (``trainer.should_stop``: a ``Timer``, ``max_time``, a callback),
    whatever its step.
    """
    every = getattr(trainer, "log_every_n_steps", 50)  # set by Lightning's logger connector
    return bool(every) and ((step + 1) % every == 0 or bool(trainer.should_stop))
