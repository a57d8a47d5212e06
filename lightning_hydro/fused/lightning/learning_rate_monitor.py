"""``TrialLearningRateMonitor``: the user's ``LearningRateMonitor`` acting per trial in a fused group.

Each trial's learning rates are logged under Lightning's names with the trial's suffix (``"lr-Adam/trial_3"``),
one logger call per step for the whole group.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import LearningRateMonitor
from typing_extensions import override

from lightning_hydro.fused.lightning.callback_view import CallbackTrainerView, LogBuffer, TrialCopies

__all__ = ["TrialLearningRateMonitor"]


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
