from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from lightning_hydro.sweeper.job.metric_history import MetricHistory
from lightning_hydro.sweeper.job.trainer_factory import ConfigTrainerFactory


def test_each_trainer_gets_fresh_callbacks_a_csv_logger_and_a_last_checkpoint(tmp_path):
    factory = ConfigTrainerFactory(
        {"max_epochs": 3, "enable_progress_bar": False},
        {"es": {"_target_": "lightning.pytorch.callbacks.EarlyStopping", "monitor": "val_loss"}, "off": None},
    )
    first = factory(root_dir=tmp_path / "a", callbacks=[MetricHistory()])
    second = factory(root_dir=tmp_path / "b")
    assert first.max_epochs == 3
    assert isinstance(first.logger, CSVLogger)
    assert Path(first.logger.log_dir) == tmp_path / "a" / "logs" / "version_0"
    names = [type(c).__name__ for c in first.callbacks]
    assert names.index("EarlyStopping") < names.index("MetricHistory") < names.index("ModelCheckpoint")
    (checkpoint,) = [c for c in first.callbacks if isinstance(c, ModelCheckpoint)]
    assert checkpoint.dirpath == str(tmp_path / "a" / "checkpoints")
    es_first = next(c for c in first.callbacks if type(c).__name__ == "EarlyStopping")
    es_second = next(c for c in second.callbacks if type(c).__name__ == "EarlyStopping")
    assert es_first is not es_second
    assert factory.last_checkpoint(tmp_path / "a") is None
    (tmp_path / "a" / "checkpoints").mkdir()
    torch.save({"epoch": 0}, tmp_path / "a" / "checkpoints" / "last.ckpt")  # a whole checkpoint (an empty file is not)
    assert factory.last_checkpoint(tmp_path / "a") == tmp_path / "a" / "checkpoints" / "last.ckpt"


def test_logger_and_checkpointing_can_be_turned_off(tmp_path):
    factory = ConfigTrainerFactory({"logger": False, "enable_checkpointing": False})
    trainer = factory(root_dir=tmp_path)
    assert trainer.logger is None
    assert not any(isinstance(c, ModelCheckpoint) for c in trainer.callbacks)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.ckpt").write_bytes(b"")
    assert factory.last_checkpoint(tmp_path) is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"default_root_dir": "/tmp"},
            r"trainer.default_root_dir is set by lightning_hydro .* Fix: remove trainer.default_root_dir",
        ),
        (
            {"callbacks": []},
            (
                r"trainer.callbacks is set by lightning_hydro .*"
                r"put callbacks under the top-level 'callbacks' key"
            ),
        ),
        (
            {"logger": "wandb"},
            r"trainer.logger must be true \(a CSV logger in each run's directory\) or false, got 'wandb'",
        ),
    ],
)
def test_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ConfigTrainerFactory(kwargs)
