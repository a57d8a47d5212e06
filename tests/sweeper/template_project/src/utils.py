"""The project's helpers, shaped like lightning-hydra-template's src/utils (instantiators, logging, extras)."""

import logging
import warnings
from typing import Any

import hydra
from lightning.pytorch import Callback
from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)


def extras(cfg: DictConfig) -> None:
    """Optional utilities before the task starts: silence warnings, check tags, print the config."""
    if not cfg.get("extras"):
        return
    if cfg.extras.get("ignore_warnings"):
        warnings.filterwarnings("ignore")
    if cfg.extras.get("enforce_tags") and not cfg.get("tags"):
        raise ValueError("Specify tags before launching a run, e.g. tags=[dev].")
    if cfg.extras.get("print_config"):
        log.info("config:\n%s", OmegaConf.to_yaml(cfg, resolve=False))


def instantiate_callbacks(callbacks_cfg: DictConfig | None) -> list[Callback]:
    """Every ``_target_`` node of the ``callbacks`` dict, instantiated."""
    if not callbacks_cfg:
        return []
    if not isinstance(callbacks_cfg, DictConfig):
        raise TypeError("Callbacks config must be a DictConfig!")
    return [hydra.utils.instantiate(c) for c in callbacks_cfg.values() if isinstance(c, DictConfig) and "_target_" in c]


def instantiate_loggers(logger_cfg: DictConfig | None) -> list[Logger]:
    """Every ``_target_`` node of the ``logger`` dict, instantiated."""
    if not logger_cfg:
        return []
    if not isinstance(logger_cfg, DictConfig):
        raise TypeError("Logger config must be a DictConfig!")
    return [hydra.utils.instantiate(c) for c in logger_cfg.values() if isinstance(c, DictConfig) and "_target_" in c]


@rank_zero_only
def log_hyperparameters(object_dict: dict[str, Any]) -> None:
    """Send the config's main sections and the parameter counts to every logger."""
    cfg, model, trainer = object_dict["cfg"], object_dict["model"], object_dict["trainer"]
    if not trainer.logger:
        return
    hparams: dict[str, Any] = {"model": OmegaConf.to_container(cfg["model"], resolve=True)}
    hparams["model/params/total"] = sum(p.numel() for p in model.parameters())
    hparams["model/params/trainable"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    for key in ("data", "trainer", "callbacks", "extras", "task_name", "tags", "ckpt_path", "seed"):
        value = cfg.get(key)
        hparams[key] = OmegaConf.to_container(value, resolve=True) if isinstance(value, DictConfig) else value
    for logger in trainer.loggers:
        logger.log_hyperparams(hparams)


def get_metric_value(metric_dict: dict[str, Any], metric_name: str | None) -> float | None:
    """The value of ``metric_name`` (the search's objective for Optuna-style sweepers), or None without one."""
    if not metric_name:
        log.info("Metric name is None! Skipping metric value retrieval...")
        return None
    if metric_name not in metric_dict:
        raise KeyError(f"Metric value not found! <metric_name={metric_name}>")
    return float(metric_dict[metric_name])
