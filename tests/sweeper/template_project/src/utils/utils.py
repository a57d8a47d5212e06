import warnings
from collections.abc import Callable
from importlib.util import find_spec
from typing import Any

from omegaconf import DictConfig

from src.utils import pylogger, rich_utils

log = pylogger.RankedLogger(__name__, rank_zero_only=True)


def extras(cfg: DictConfig) -> None:
    """What to do before the task starts: silence warnings, ask for tags, print the config (see configs/extras)."""
    if not cfg.get("extras"):
        log.warning("No extras config <cfg.extras=null>.")
        return

    if cfg.extras.get("ignore_warnings"):
        log.info("Silencing Python warnings <cfg.extras.ignore_warnings=True>")
        warnings.filterwarnings("ignore")

    if cfg.extras.get("enforce_tags"):
        log.info("Checking the tags <cfg.extras.enforce_tags=True>")
        rich_utils.enforce_tags(cfg, save_to_file=True)

    if cfg.extras.get("print_config"):
        log.info("Printing the config tree <cfg.extras.print_config=True>")
        rich_utils.print_config_tree(cfg, resolve=True, save_to_file=True)


def task_wrapper(task_func: Callable) -> Callable:
    """Run the task, logging any exception to the job's log before it propagates, and close wandb if it runs."""

    def wrap(cfg: DictConfig) -> tuple[dict[str, Any], dict[str, Any]]:
        try:
            metric_dict, object_dict = task_func(cfg=cfg)
        except Exception as ex:
            log.exception("")  # the traceback, into the job's .log file
            # a search may prefer to go on after a failed combination; this one stops, as the template does
            raise ex
        finally:
            log.info(f"Output dir: {cfg.paths.output_dir}")
            if find_spec("wandb"):
                import wandb

                if wandb.run:
                    log.info("Closing wandb")
                    wandb.finish()
        return metric_dict, object_dict

    return wrap


def get_metric_value(metric_dict: dict[str, Any], metric_name: str | None) -> float | None:
    """The value of the logged metric ``metric_name`` (for a hyperparameter search), or None without a name."""
    if not metric_name:
        log.info("No metric name: no value to return.")
        return None

    if metric_name not in metric_dict:
        raise Exception(
            f"Metric value not found! <metric_name={metric_name}>\n"
            "Check that the LightningModule logs this name,\n"
            "and the `optimized_metric` name in the `hparams_search` config."
        )

    metric_value = metric_dict[metric_name].item()
    log.info(f"Retrieved metric value! <{metric_name}={metric_value}>")

    return metric_value
