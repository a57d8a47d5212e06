"""Train the configured model, then test it with the best checkpoint fit kept.

One run: ``python src/train.py``; a search: ``python src/train.py -m hparams_search=mnist_lightning_hydro``.
"""

import os
import sys
from pathlib import Path
from typing import Any

# What the template's `rootutils.setup_root(__file__, indicator=".project-root", pythonpath=True)` does (rootutils
# is not installed here): the project's root importable and in $PROJECT_ROOT, which configs/paths reads.
ROOT = next(p for p in Path(__file__).resolve().parents if (p / ".project-root").exists())
sys.path.insert(0, str(ROOT))
os.environ.setdefault("PROJECT_ROOT", str(ROOT))

import hydra  # noqa: E402
import lightning as L  # noqa: E402
from lightning import Callback, LightningDataModule, LightningModule, Trainer  # noqa: E402
from lightning.pytorch.loggers import Logger  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from src.utils import (  # noqa: E402
    RankedLogger,
    extras,
    get_metric_value,
    instantiate_callbacks,
    instantiate_loggers,
    log_hyperparameters,
    task_wrapper,
)

log = RankedLogger(__name__, rank_zero_only=True)


@task_wrapper
def train(cfg: DictConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fit the model from ``cfg``; with ``cfg.test``, test it with the best weights fit kept.

    Returns:
        The metrics of fit and test merged, and every object built from the config.
    """
    if cfg.get("seed"):
        L.seed_everything(cfg.seed, workers=True)

    log.info(f"Building the data module <{cfg.data._target_}>")
    datamodule: LightningDataModule = hydra.utils.instantiate(cfg.data)

    log.info(f"Building the model <{cfg.model._target_}>")
    model: LightningModule = hydra.utils.instantiate(cfg.model)

    log.info("Building the callbacks...")
    callbacks: list[Callback] = instantiate_callbacks(cfg.get("callbacks"))

    log.info("Building the loggers...")
    logger: list[Logger] = instantiate_loggers(cfg.get("logger"))

    log.info(f"Building the trainer <{cfg.trainer._target_}>")
    trainer: Trainer = hydra.utils.instantiate(cfg.trainer, callbacks=callbacks, logger=logger)

    object_dict = {
        "cfg": cfg,
        "datamodule": datamodule,
        "model": model,
        "callbacks": callbacks,
        "logger": logger,
        "trainer": trainer,
    }

    if logger:
        log.info("Logging the hyperparameters")
        log_hyperparameters(object_dict)

    if cfg.get("train"):
        log.info("Training")
        trainer.fit(model=model, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))

    train_metrics = trainer.callback_metrics

    if cfg.get("test"):
        log.info("Testing")
        ckpt_path = trainer.checkpoint_callback.best_model_path
        if ckpt_path == "":
            log.warning("No best checkpoint was kept: testing the current weights")
            ckpt_path = None
        trainer.test(model=model, datamodule=datamodule, ckpt_path=ckpt_path)
        log.info(f"Tested the checkpoint {ckpt_path}")

    test_metrics = trainer.callback_metrics

    metric_dict = {**train_metrics, **test_metrics}

    return metric_dict, object_dict


@hydra.main(version_base="1.3", config_path="../configs", config_name="train.yaml")
def main(cfg: DictConfig) -> float | None:
    """Train, and return the value of ``cfg.optimized_metric`` (what an Optuna-style sweeper maximizes)."""
    extras(cfg)

    metric_dict, _ = train(cfg)

    return get_metric_value(metric_dict=metric_dict, metric_name=cfg.get("optimized_metric"))


if __name__ == "__main__":
    main()
