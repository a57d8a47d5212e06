"""Train a model from configs/, then test it: ``python src/train.py`` (``-m`` with an hparams_search to tune)."""

import os
import sys
from pathlib import Path
from typing import Any

# What the template's rootutils.setup_root does: the project root on sys.path and in $PROJECT_ROOT.
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PROJECT_ROOT", str(ROOT))

import hydra  # noqa: E402
import lightning as L  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from src.utils import extras, get_metric_value, instantiate_callbacks, instantiate_loggers, log_hyperparameters  # noqa: E402


def train(cfg: DictConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fit the configured model (and test it with the best checkpoint); return the metrics and the objects."""
    if cfg.get("seed"):
        L.seed_everything(cfg.seed, workers=True)
    datamodule = hydra.utils.instantiate(cfg.data)
    model = hydra.utils.instantiate(cfg.model)
    callbacks = instantiate_callbacks(cfg.get("callbacks"))
    logger = instantiate_loggers(cfg.get("logger"))
    trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=logger)
    object_dict = {
        "cfg": cfg,
        "datamodule": datamodule,
        "model": model,
        "callbacks": callbacks,
        "logger": logger,
        "trainer": trainer,
    }
    if logger:
        log_hyperparameters(object_dict)
    if cfg.get("train"):
        trainer.fit(model=model, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"), weights_only=False)
    train_metrics = dict(trainer.callback_metrics)
    if cfg.get("test"):
        ckpt_path = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
        # weights_only=False: the checkpoint holds the module's hyperparameters (Hydra partials), which
        # torch>=2.6's default weights-only loading refuses
        trainer.test(model=model, datamodule=datamodule, ckpt_path=ckpt_path or None, weights_only=False)
    test_metrics = dict(trainer.callback_metrics)
    return {**train_metrics, **test_metrics}, object_dict


@hydra.main(version_base="1.3", config_path="../configs", config_name="train.yaml")
def main(cfg: DictConfig) -> float | None:
    """Train, and return the metric that an Optuna-style sweeper optimizes (``optimized_metric``)."""
    extras(cfg)
    metric_dict, _ = train(cfg)
    return get_metric_value(metric_dict, cfg.get("optimized_metric"))


if __name__ == "__main__":
    main()
