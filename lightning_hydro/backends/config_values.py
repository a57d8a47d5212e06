"""Config objects as plain values: what the scan of the trials' Python values compares inside them.

Research code keeps hyperparameters in config objects: Hydra's ``DictConfig`` (also as ``self.hparams``, after
``self.save_hyperparameters(cfg)``), a dataclass, a ``SimpleNamespace`` or an ``argparse.Namespace``. A value that
differs between trials inside one of them, read by a fused step (``self.loss_cfg.anneal_steps``), must be found
as a plain attribute's is: vmap and hfta run one template's Python for every trial. The scan
(:mod:`~lightning_hydro.backends.trial_attributes`) compares plain values only, so a config object is flattened
into its leaves, each under its dotted name (``loss_cfg.anneal_steps``); a leaf counts as read where the fused code
names both the attribute and the leaf's own name.

Example::

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Loss:
    ...     gamma: float
    ...     weights: tuple = (1.0, 2.0)
    >>> config_leaves("loss", Loss(2.0))
    {'loss.gamma': 2.0, 'loss.weights': (1.0, 2.0)}
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any

__all__ = ["config_fields", "config_leaves", "plain_mapping"]

_DEPTH = 6  # nested configs deeper than this are left to the first-batch check


def config_fields(value: Any) -> Mapping[str, Any] | None:
    """The fields of a config object (OmegaConf node, dataclass instance, namespace) by name; None for others.

    An OmegaConf node is read resolved (its interpolations as their values); one that cannot resolve is read as
    written. A list node is returned with its items under ``"0"``, ``"1"``, ...
    """
    if type(value).__module__.startswith("omegaconf"):
        return _omegaconf_fields(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: getattr(value, field.name, None) for field in dataclasses.fields(value)}
    if isinstance(value, (SimpleNamespace, argparse.Namespace)):
        return dict(vars(value))
    return None


def _omegaconf_fields(value: Any) -> Mapping[str, Any] | None:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if not isinstance(value, (DictConfig, ListConfig)):
        return None
    try:
        container = OmegaConf.to_container(value, resolve=True)
    except Exception:  # an interpolation that does not resolve here (e.g. ${hydra:...} outside a Hydra run)
        container = OmegaConf.to_container(value, resolve=False)
    if isinstance(container, list):
        return {str(index): item for index, item in enumerate(container)}
    if isinstance(container, dict):
        return {str(key): item for key, item in container.items()}
    return None


def config_leaves(name: str, value: Any, comparable: Callable[[Any], bool] = lambda v: True) -> dict[str, Any]:
    """``value``'s leaves by dotted name under ``name``: a config object's fields, and theirs, down to the values.

    Mappings with string keys are opened too; a leaf is kept where ``comparable`` accepts it. Returns an empty dict
    where ``value`` is neither a config object nor a mapping.
    """
    found: dict[str, Any] = {}

    def visit(prefix: str, fields: Mapping[str, Any], depth: int) -> None:
        if depth >= _DEPTH:
            return
        for key, item in fields.items():
            inner = _opened(item)
            if inner is not None:
                visit(f"{prefix}.{key}", inner, depth + 1)
            elif comparable(item):
                found[f"{prefix}.{key}"] = item

    top = _opened(value)
    if top is not None:
        visit(name, top, 0)
    return found


def _opened(value: Any) -> Mapping[str, Any] | None:
    """A config object's fields, or a mapping with string keys itself; None for anything else."""
    fields = config_fields(value)
    if fields is None and isinstance(value, Mapping) and all(isinstance(key, str) for key in value):
        return value
    return fields


def plain_mapping(value: Any) -> Mapping[str, Any] | None:
    """A mapping of ``value``'s entries (a dict, or an OmegaConf ``DictConfig`` as plain containers), else None.

    What ``self.hparams`` is: Lightning's ``AttributeDict``, or the ``DictConfig`` given to ``save_hyperparameters``.
    """
    if isinstance(value, dict):
        return value
    if type(value).__module__.startswith("omegaconf"):
        fields = _omegaconf_fields(value)
        return None if fields is None or not isinstance(value, Mapping) else fields
    return None
