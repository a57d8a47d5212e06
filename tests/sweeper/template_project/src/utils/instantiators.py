import hydra
from lightning import Callback
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig

from src.utils import pylogger

log = pylogger.RankedLogger(__name__, rank_zero_only=True)


def instantiate_callbacks(callbacks_cfg: DictConfig) -> list[Callback]:
    """Every node of ``callbacks_cfg`` that has a ``_target_``, instantiated."""
    callbacks: list[Callback] = []
    if not callbacks_cfg:
        log.warning("No callbacks configured.")
        return callbacks
    if not isinstance(callbacks_cfg, DictConfig):
        raise TypeError("The callbacks config must be a DictConfig.")
    for _, cb_conf in callbacks_cfg.items():
        if isinstance(cb_conf, DictConfig) and "_target_" in cb_conf:
            log.info(f"Building callback <{cb_conf._target_}>")
            callbacks.append(hydra.utils.instantiate(cb_conf))
    return callbacks


def instantiate_loggers(logger_cfg: DictConfig) -> list[Logger]:
    """Every node of ``logger_cfg`` that has a ``_target_``, instantiated."""
    loggers: list[Logger] = []
    if not logger_cfg:
        log.warning("No logger configured.")
        return loggers
    if not isinstance(logger_cfg, DictConfig):
        raise TypeError("The logger config must be a DictConfig.")
    for _, lg_conf in logger_cfg.items():
        if isinstance(lg_conf, DictConfig) and "_target_" in lg_conf:
            log.info(f"Building logger <{lg_conf._target_}>")
            loggers.append(hydra.utils.instantiate(lg_conf))
    return loggers
