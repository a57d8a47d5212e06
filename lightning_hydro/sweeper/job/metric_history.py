"""MetricHistory: a callback that records every trial's scalar metrics once per epoch, resumably.

A fused module logs each trial's metrics as ``"{name}/trial_{id}"``; an ordinary module logs plain
names, which the callback files under ``default_trial``. The records live in the callback's
``state_dict``, so they are saved in ``last.ckpt`` and survive a resume (Lightning's CSVLogger starts a
new file on resume, so the learning curves cannot be read back from it).

Example::

    >>> history = MetricHistory(default_trial=7)
    >>> history.record(epoch=0, metrics={"val_acc": 0.5, "val_acc/trial_3": 0.25})
    >>> history.of(7), history.of(3)
    ([{'epoch': 0, 'val_acc': 0.5}], [{'epoch': 0, 'val_acc': 0.25}])
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

__all__ = ["MetricHistory", "scalar_metrics"]

_TRIAL_SUFFIX = "/trial_"


def scalar_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The scalar entries of ``metrics`` (e.g. ``trainer.callback_metrics``) as floats."""
    out = {}
    for name, value in metrics.items():
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                continue
            value = value.item()
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = float(value)
    return out


class MetricHistory(Callback):
    """Records ``trainer.callback_metrics`` after each validation and each training epoch, per trial.

    Args:
        default_trial: the trial that metrics without a ``/trial_{id}`` suffix belong to (``None``: drop
            them).
    """

    def __init__(self, default_trial: int | None = None) -> None:
        self.default_trial = default_trial
        self._records: dict[int, dict[int, dict[str, float]]] = {}

    def record(self, *, epoch: int, metrics: Mapping[str, Any]) -> None:
        """Merge the scalar ``metrics`` into the records of ``epoch``."""
        for name, value in scalar_metrics(metrics).items():
            base, sep, suffix = name.rpartition(_TRIAL_SUFFIX)
            if sep and suffix.isdigit():
                trial: int | None = int(suffix)
                name = base
            else:
                trial = self.default_trial
            if trial is not None:
                self._records.setdefault(trial, {}).setdefault(epoch, {})[name] = value

    def of(self, trial_id: int) -> list[dict[str, float]]:
        """The records of ``trial_id``: one dict per epoch, with its ``epoch`` and each metric."""
        by_epoch = self._records.get(trial_id, {})
        return [{"epoch": epoch, **by_epoch[epoch]} for epoch in sorted(by_epoch)]

    def last(self, trial_id: int) -> dict[str, float]:
        """The latest value of each metric of ``trial_id``."""
        out: dict[str, float] = {}
        for row in self.of(trial_id):
            out.update({k: v for k, v in row.items() if k != "epoch"})
        return out

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self.record(epoch=trainer.current_epoch, metrics=trainer.callback_metrics)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.record(epoch=trainer.current_epoch, metrics=trainer.callback_metrics)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"records": {t: dict(r) for t, r in self._records.items()}}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._records = {int(t): {int(e): dict(m) for e, m in r.items()} for t, r in state_dict["records"].items()}
