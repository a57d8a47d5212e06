"""A test helper callback: freeze one job mid-training, so that a test can SIGKILL the sweep there."""

from __future__ import annotations

import fnmatch
import os
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback


class PauseInGroup(Callback):
    """While ``armed_file`` exists: in the job of ``group`` (a name or a pattern, e.g. ``retrain_*``), at the
    start of epoch ``epoch`` (the previous epoch's checkpoint is saved by then), touch ``paused_file`` and sleep
    until killed."""

    def __init__(self, group: str, armed_file: str, paused_file: str, epoch: int = 1) -> None:
        self.group, self.armed_file, self.paused_file, self.epoch = group, armed_file, paused_file, epoch

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        mine = fnmatch.fnmatchcase(os.environ.get("LIGHTNING_HYDRO_GROUP", ""), self.group)
        if mine and trainer.current_epoch >= self.epoch and Path(self.armed_file).exists():
            Path(self.paused_file).touch()
            time.sleep(600)
