from collections.abc import Sequence
from pathlib import Path

import rich
import rich.syntax
import rich.tree
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf, open_dict
from rich.prompt import Prompt

from src.utils import pylogger

log = pylogger.RankedLogger(__name__, rank_zero_only=True)


@rank_zero_only
def print_config_tree(
    cfg: DictConfig,
    print_order: Sequence[str] = ("data", "model", "callbacks", "logger", "trainer", "paths", "extras"),
    resolve: bool = False,
    save_to_file: bool = False,
) -> None:
    """Print the config as a tree with rich, the fields of ``print_order`` first; optionally save it."""
    tree = rich.tree.Tree("CONFIG", style="dim", guide_style="dim")
    queue = []
    for field in print_order:
        if field in cfg:
            queue.append(field)
        else:
            log.warning(f"Field '{field}' is not in the config: not printed.")
    queue += [field for field in cfg if field not in queue]
    for field in queue:
        branch = tree.add(field, style="dim", guide_style="dim")
        section = cfg[field]
        text = OmegaConf.to_yaml(section, resolve=resolve) if isinstance(section, DictConfig) else str(section)
        branch.add(rich.syntax.Syntax(text, "yaml"))
    rich.print(tree)
    if save_to_file:
        with open(Path(cfg.paths.output_dir, "config_tree.log"), "w") as file:
            rich.print(tree, file=file)


@rank_zero_only
def enforce_tags(cfg: DictConfig, save_to_file: bool = False) -> None:
    """Ask for tags on the command line when the config has none (a multirun must have them)."""
    if not cfg.get("tags"):
        if "id" in HydraConfig().cfg.hydra.job:
            raise ValueError("Give tags before launching a multirun, e.g. tags=[dev].")
        log.warning("No tags in the config: asking for them.")
        tags = Prompt.ask("Enter a list of comma separated tags", default="dev")
        tags = [t.strip() for t in tags.split(",") if t != ""]
        with open_dict(cfg):
            cfg.tags = tags
        log.info(f"Tags: {cfg.tags}")
    if save_to_file:
        with open(Path(cfg.paths.output_dir, "tags.log"), "w") as file:
            rich.print(cfg.tags, file=file)
