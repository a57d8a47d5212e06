"""The layout of an app config that :func:`~lightning_hydro.sweeper.fit_from_config` understands.

.. code-block:: yaml

    seed: 0                  # seeds each trial's module (optional, default 0; null: a seed per trial, recorded)
    model:                   # one trial's LightningModule; the only section trials of a group may vary
      _target_: lightning_hydro.demos.DigitsMLP
      lr: 0.05
    data:                    # the LightningDataModule, shared by the trials of a group
      _target_: lightning_hydro.demos.DigitsDataModule
      batch_size: 64
    trainer:                 # keyword arguments of lightning.Trainer (optional)
      _target_: lightning.pytorch.trainer.Trainer   # optional: a Trainer class (or subclass)
      default_root_dir: ${paths.output_dir}         # optional: where the runs go (default: the job's dir)
      max_epochs: 10
    callbacks:               # name -> instantiable Lightning callback (optional)
      early_stop: {_target_: lightning.pytorch.callbacks.EarlyStopping, monitor: val_loss}
    logger:                  # name -> instantiable Lightning logger (optional; a CSV logger is always added)
      tensorboard: {_target_: lightning.pytorch.loggers.TensorBoardLogger, save_dir: ${paths.output_dir}}
    fused:                   # how sweep jobs fuse their trials (optional; FusedLightningModule's options)
      backend: auto
      optimizer_path: auto
      deterministic: false   # true: backend auto chooses without timing (reproducible numbers)
      pad_widths: false      # true: trials whose hidden sizes differ fuse, zero-padded (docs/fused.md)
    scaling:                 # muP surrogates (optional): search at width / ratio, retrain at full size
      width: [hidden_dim]    # the model's width hyperparameters
      ratio: 4
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

__all__ = [
    "CALLBACKS_KEY",
    "DATA_KEY",
    "FUSED_KEY",
    "LOGGER_KEY",
    "MODEL_KEY",
    "SCALING_KEY",
    "SEED_KEY",
    "TRAINER_KEY",
    "check_sweep_keys",
    "config_section",
    "has_key",
    "similar_keys",
]

MODEL_KEY = "model"
DATA_KEY = "data"
TRAINER_KEY = "trainer"
CALLBACKS_KEY = "callbacks"
LOGGER_KEY = "logger"
FUSED_KEY = "fused"
SCALING_KEY = "scaling"
SEED_KEY = "seed"


def config_section(node: Any, *, what: str) -> dict[str, Any]:
    """A config section as a plain dict (values resolved, keys strings); an absent or ``null`` section is empty.

    The one reader of a section as settings: the app config's ``trainer``, ``callbacks``, ``logger`` and ``fused``,
    and the sections of ``hydra.sweeper``.

    Args:
        node: the section: a ``DictConfig``, a plain mapping (settings given in code), or ``None``.
        what: how the error names the section, with its owner, e.g. ``"fit_from_config: the config's 'trainer'"``.

    Raises:
        ValueError: ``node`` is a value rather than a section (neither a mapping nor ``None``).

    Example::

        >>> config_section(OmegaConf.create({"width": 8, "double": "${width}"}), what="model")
        {'width': 8, 'double': 8}
        >>> config_section(None, what="fused")
        {}
        >>> config_section(True, what="the config's 'fused'")
        Traceback (most recent call last):
        ...
        ValueError: the config's 'fused' must be a section (key: value entries) or null, got True. ...
    """
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=True)  # None for a section set to null
    if node is None:
        return {}
    if not isinstance(node, Mapping):
        raise ValueError(
            f"{what} must be a section (key: value entries) or null, got {node!r}. Fix: write it as key: value "
            "entries (e.g. trainer: {max_epochs: 10}), or leave it out."
        )
    return {str(key): value for key, value in node.items()}


def has_key(cfg: DictConfig, key: str) -> bool:
    """Whether the dotted ``key`` exists in ``cfg`` (a mandatory ``???`` value counts as existing)."""
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(cfg, parent_key, default=None) if parent_key else cfg
    if not isinstance(parent, DictConfig):
        return False
    return leaf in parent or OmegaConf.is_missing(parent, leaf)


def similar_keys(cfg: DictConfig, key: str, n: int = 3) -> list[str]:
    """Dotted keys of ``cfg`` (outside ``hydra``) that look like ``key``, for "did you mean" hints."""
    tree = OmegaConf.to_container(cfg, resolve=False)
    keys = [k for k in _dotted_keys(tree, "") if k != "hydra" and not k.startswith("hydra.")]
    return difflib.get_close_matches(key, keys, n=n)


def _dotted_keys(node: Any, prefix: str) -> list[str]:
    if not isinstance(node, dict):
        return []
    out = []
    for k, v in node.items():
        out.append(f"{prefix}{k}")
        out.extend(_dotted_keys(v, f"{prefix}{k}."))
    return out


def check_sweep_keys(cfg: DictConfig, swept: Mapping[str, str], non_fusible: Sequence[str]) -> None:
    """Check, before any job starts, that the sweep's keys fit the config.

    Args:
        cfg: the composed app config (with its ``hydra`` node, whose ``runtime.choices`` lists config groups).
        swept: each swept key and its override prefix (``""``, ``"+"`` or ``"++"``).
        non_fusible: keys whose value must be equal within a group.

    Raises:
        ValueError: for a non-fusible key that is not in the config, a swept key that is not in the config
            (and not added with ``+``), or a swept key outside ``model`` that is not declared non-fusible.
    """
    choices = OmegaConf.select(cfg, "hydra.runtime.choices", default=None)
    groups = set(choices.keys()) if isinstance(choices, DictConfig) else set()
    for key in non_fusible:
        if key not in groups and not has_key(cfg, key) and not swept.get(key, "").startswith("+"):
            raise ValueError(
                f"lightning_hydro sweeper: non-fusible key {key!r} is not in the config{_hint(cfg, key)}. "
                "Expected a key of the app's config (e.g. 'data.batch_size'). Fix: correct or remove it in "
                "hydra.sweeper.non_fusible."
            )
    for key, prefix in swept.items():
        if key in non_fusible:
            continue
        if key in groups or not key.startswith(f"{MODEL_KEY}."):
            raise ValueError(
                f"lightning_hydro sweeper: {key!r} is searched but not declared non-fusible; only keys under "
                f"'{MODEL_KEY}' may differ between the trials of one fused group. Fix: add {key!r} to "
                "hydra.sweeper.non_fusible."
            )
        if not prefix and not has_key(cfg, key):
            raise ValueError(
                f"lightning_hydro sweeper: searched key {key!r} is not in the config{_hint(cfg, key)}. Fix: "
                f"correct the key, or add it with '+{key}=...'."
            )


def _hint(cfg: DictConfig, key: str) -> str:
    close = similar_keys(cfg, key)
    return f" (did you mean {' or '.join(repr(k) for k in close)}?)" if close else ""
