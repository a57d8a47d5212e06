"""``TrialModelCheckpoint``: the user's ``ModelCheckpoint`` acting per trial, and answering as it does alone.

A user who trains one model writes ``ModelCheckpoint(monitor="val/acc", mode="max", save_last=True)`` and, after
``fit``, loads ``MyModule.load_from_checkpoint(trainer.checkpoint_callback.best_model_path)`` (or reads the same from
their own callback object). In a fused group this callback (which :func:`~.callbacks.per_trial_callbacks`
puts in place of the user's at fit start) writes three kinds of file, all under the user's ``dirpath``:

- **each trial's own checkpoints**, in ``{dirpath}/trial_{id}/``: a copy of the user's callback per trial, with
  every setting (``filename``, ``save_top_k``, ``save_last``, ...), writes checkpoints of the trial's own module in
  Lightning's format (:func:`~.callback_view.trial_checkpoint`), which ``MyModule.load_from_checkpoint`` loads;
- **the group checkpoint**, in ``{dirpath}/`` itself: the whole fused group (every trial's rows, optimizer and
  scheduler state, slots, records, callback states), written as a ``ModelCheckpoint`` without a monitor writes
  (the latest, and ``last.ckpt`` with ``save_last``): ``group_model_path`` and ``last_model_path`` name it, and
  ``trainer.fit(fused, ckpt_path=...)`` resumes the group from it (``ckpt_path="last"`` finds it too);
- nothing else: what the user reads from the callback after the fit is a summary over the trials' own checkpoints.

``best_model_path``, ``best_model_score``, ``best_k_models``, ``kth_best_model_path`` and ``kth_value`` of this
callback **and of the user's own ``ModelCheckpoint`` object** answer as one callback that had watched every trial:
``best_model_path`` is the best trial's own best checkpoint (by the monitor and mode), ``best_k_models`` the
``save_top_k`` best over all trials' checkpoints. ``trainer.test(fused, ckpt_path=best_model_path)`` (or
``ckpt_path="best"``), lightning-hydra-template's ``train.py`` after fit, is recognised by the fused module: a
trial's own checkpoint given to a fused group restores the group from this callback's group checkpoint and tests
every trial, as before (:func:`~lightning_hydro.fused.lightning.group_checkpoint.group_checkpoint_for_trial`).
"""

from __future__ import annotations

import copy
import math
import os
import re
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from typing_extensions import override

from lightning_hydro.fused.lightning.callback_view import CallbackTrainerView, TrialCopies

__all__ = ["TrialModelCheckpoint"]

# What the summary tells the user's callback object (what Lightning's ModelCheckpoint tells after a fit).
_SUMMARY = ("best_model_path", "best_model_score", "best_k_models", "kth_best_model_path", "kth_value")


def _settings(template: ModelCheckpoint, **changes: Any) -> dict[str, Any]:
    """The user's callback's settings, as ``ModelCheckpoint.__init__`` takes them, with ``changes``."""
    settings: dict[str, Any] = dict(
        dirpath=template.dirpath,
        filename=template.filename,
        monitor=template.monitor,
        verbose=template.verbose,
        save_last=template.save_last,
        save_top_k=template.save_top_k,
        save_weights_only=template.save_weights_only,
        mode=template.mode,
        auto_insert_metric_name=template.auto_insert_metric_name,
        every_n_train_steps=template._every_n_train_steps,
        train_time_interval=template._train_time_interval,
        every_n_epochs=template._every_n_epochs,
        save_on_train_epoch_end=template._save_on_train_epoch_end,
        enable_version_counter=template._enable_version_counter,
    )
    settings.update(changes)
    return settings


def _group_filename(filename: str | None) -> str | None:
    """The group checkpoint's file name: the user's, unless it names a metric, which no group value has.

    Lightning writes a metric missing from the values as 0 (``epoch=5-val_loss=0.00.ckpt``), which would pass for a
    score; the group's checkpoint then takes Lightning's default name (``epoch=5-step=30.ckpt``).
    """
    if filename is None:
        return None
    names = {field.strip("{") for field in re.findall(r"(\{.*?)[:}]", filename)}
    return filename if names <= {"epoch", "step"} else None


class TrialModelCheckpoint(ModelCheckpoint):
    """The user's ``ModelCheckpoint`` per trial, the group's checkpoint, and the user's answers (module docstring).

    Args:
        template: the user's ``ModelCheckpoint``; each trial's copy has its settings, in ``{dirpath}/trial_{id}``;
            after every round of saves its ``best_model_path`` ... hold the summary over the trials.

    Attributes:
        group_checkpoint: the ``ModelCheckpoint`` (no monitor) that writes the group checkpoints in ``dirpath``.
    """

    def __init__(self, template: ModelCheckpoint) -> None:
        super().__init__(**_settings(template))
        self.template = template
        # each trial's copy is made from the settings as given, not from the summary the user's object receives
        self._pristine = copy.deepcopy(template)
        self.group_checkpoint = ModelCheckpoint(
            **_settings(template, monitor=None, save_top_k=1, mode="min", filename=_group_filename(template.filename))
        )
        self._trials = TrialCopies(self._pristine, self._prepare_copy)
        self._live_at: dict[int, int] = {}  # the global step at which each trial was last seen in its slot
        self._finished: set[int] = set()

    @property
    @override
    def state_key(self) -> str:
        # the group's own settings (no monitor) are the same for every translated ModelCheckpoint: the user's
        # callback names it, so that two of them keep two states in a checkpoint
        return self._generate_state_key(per_trial=self._pristine.state_key)

    @property
    def trial_callbacks(self) -> dict[int, ModelCheckpoint]:
        """Each trial's ``ModelCheckpoint``, by trial id."""
        return dict(self._trials.copies)  # type: ignore[arg-type]

    @property
    def trial_best_model_paths(self) -> dict[int, str]:
        """Each trial's best checkpoint so far (a checkpoint of the trial's own module), by trial id."""
        return {tid: c.best_model_path for tid, c in self.trial_callbacks.items()}

    @property
    def group_model_path(self) -> str:
        """The latest group checkpoint (every trial, the slots, the records): resume or evaluate the group from it."""
        return self.group_checkpoint.best_model_path

    def _prepare_copy(self, callback: Callback, trial_id: int) -> None:
        if isinstance(callback, ModelCheckpoint):  # self.dirpath: resolved by setup, which precedes every copy
            callback.dirpath = os.path.join(str(self.dirpath), f"trial_{trial_id}")

    def _targets(self, trainer: L.Trainer, fused: Any) -> list[int]:
        """The running trials, and those that left their slot at this very step (their final checkpoint)."""
        step = trainer.global_step
        live = fused.trial_ids
        for tid in live:
            self._live_at[tid] = step
        left = [t for t, s in self._live_at.items() if t not in live and t not in self._finished and s == step]
        return [*live, *left]

    def _each_trial(self, trainer: L.Trainer, fused: Any, hook: str, *args: Any) -> None:
        live = set(fused.trial_ids)
        for tid, callback, view in self._trials.run(trainer, fused, self._targets(trainer, fused)):
            getattr(callback, hook)(view, view.lightning_module, *args)
            # a trial that left at this step is done once its copy has saved this step (Lightning saves at the
            # training epoch's end where validation closes each epoch: not yet in on_validation_end)
            if tid not in live and getattr(callback, "_last_global_step_saved", None) == trainer.global_step:
                self._finished.add(tid)
        self._summarize()

    # -- the summary over the trials ----------------------------------------------------------------------------

    def _trial_best_k(self) -> dict[str, Any]:
        """Every trial's kept checkpoints with their scores (the copies made, and those waiting after a resume)."""
        found: dict[str, Any] = {}
        for state in self._trials.pending_states.values():
            found.update(state.get("best_k_models") or {})
        for callback in self._trials.copies.values():
            found.update(callback.best_k_models)  # type: ignore[attr-defined]
        return found

    def _summarize(self) -> None:
        """Set the summary on this callback and on the user's: the best over every trial's own checkpoints."""
        scored = self._trial_best_k()
        worst = math.inf if self.mode == "min" else -math.inf

        def rank(item: tuple[str, Any]) -> float:
            value = float(item[1])
            value = worst if math.isnan(value) else value
            return value if self.mode == "min" else -value

        ordered = sorted(scored.items(), key=rank)
        if self.save_top_k >= 0:
            ordered = ordered[: self.save_top_k]
        self.best_k_models = dict(ordered)
        if ordered:
            self.best_model_path, self.best_model_score = ordered[0][0], torch.as_tensor(ordered[0][1])
            self.kth_best_model_path, self.kth_value = ordered[-1][0], torch.as_tensor(ordered[-1][1])
        self.last_model_path = self.group_checkpoint.last_model_path
        self._publish()

    def _publish(self) -> None:
        for name in _SUMMARY:
            setattr(self.template, name, copy.copy(getattr(self, name)))
        self.template.last_model_path = self.last_model_path
        self.template.dirpath = self.dirpath

    # -- Lightning's hooks: the trials' copies first, then the group (its checkpoint holds the copies' states) ---

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self.group_checkpoint.setup(trainer, pl_module, stage)
        self._trials.stage = stage
        for tid, callback in self._trials.copies.items():
            callback.setup(CallbackTrainerView(trainer, pl_module, tid), pl_module, stage)  # type: ignore[arg-type]

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.group_checkpoint.on_train_start(trainer, pl_module)
        self._each_trial(trainer, pl_module, "on_train_start")

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if not self._every_n_train_steps and self._train_time_interval is None:
            self._targets(trainer, pl_module)  # nothing to save per step; only note who is running
        else:
            self._each_trial(trainer, pl_module, "on_train_batch_end", *args)
        self.group_checkpoint.on_train_batch_end(trainer, pl_module, *args)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._each_trial(trainer, pl_module, "on_train_epoch_end")
        self.group_checkpoint.on_train_epoch_end(trainer, pl_module)
        self._summarize()

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._each_trial(trainer, pl_module, "on_validation_end")
        self.group_checkpoint.on_validation_end(trainer, pl_module)
        self._summarize()

    @override
    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.group_checkpoint.on_exception(trainer, pl_module, exception)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.group_checkpoint.on_train_end(trainer, pl_module)
        self._summarize()

    @override
    def state_dict(self) -> dict[str, Any]:
        group, trials = self.group_checkpoint.state_dict(), self._trials.state_dict()
        return {**super().state_dict(), "group": group, "trials": trials}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        self._trials.pending_states.update(state.pop("trials", {}))
        group = state.pop("group", None)
        if group is None:  # written before the summary existed: the callback's own state was the group's
            self.group_checkpoint.load_state_dict(state)
        else:
            self.group_checkpoint.load_state_dict(group)
            super().load_state_dict(state)
        self._summarize()
