"""Trial override lines (``key=value``, ``+key=value``) applied to a copy of a config."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

__all__ = ["apply_overrides"]


def apply_overrides(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """A copy of ``cfg`` with override lines (``key=value``, ``+key=value``) applied.

    Example::

        >>> cfg = OmegaConf.create({"model": {"lr": 0.1}})
        >>> apply_overrides(cfg, ["model.lr=0.5", "+model.momentum=0.9"]).model
        {'lr': 0.5, 'momentum': 0.9}

    Raises:
        ValueError: for a deletion or a sweep, which have no single value.
    """
    out = copy.deepcopy(cfg)
    for override in OverridesParser.create().parse_overrides(list(overrides)):
        if override.is_delete() or override.is_sweep_override():
            raise ValueError(f"apply_overrides: a trial override needs a single value, got {override.input_line!r}.")
        force_add = override.is_add() or override.is_force_add()
        OmegaConf.update(out, override.key_or_group, override.value(), force_add=force_add)
    return out
