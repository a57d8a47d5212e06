"""``fit_from_config``: what a Hydra task function calls to train from its config, alone or in a sweep.

In a plain run (``python train.py``) it trains the config's model once (trial 0). In a job launched by
the ``lightning_hydro`` sweeper it reads its group's spec (see :mod:`~lightning_hydro.sweeper.group_spec`),
builds one module per trial (the job's config with the trial's overrides), and trains them all through
:func:`~lightning_hydro.sweeper.fit_trials.fit_trials`. Its config layout is described in
:mod:`~lightning_hydro.sweeper.app_config`.

Example (``examples/train.py``)::

    @hydra.main(version_base="1.3", config_path="../conf", config_name="train")
    def main(cfg: DictConfig) -> dict[int, TrialResult]:
        return fit_from_config(cfg)
"""

from __future__ import annotations

import copy
import logging
import os
import socket
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from lightning_hydro.sweeper.app_config import (
    CALLBACKS_KEY,
    DATA_KEY,
    FUSED_KEY,
    MODEL_KEY,
    SCALING_KEY,
    SEED_KEY,
    TRAINER_KEY,
)
from lightning_hydro.sweeper.fit_trials import FusedSettings, TrialResult, fit_trials
from lightning_hydro.sweeper.fusion_limit import measure_fusion_limit
from lightning_hydro.sweeper.group_spec import GroupSpec, TrialSpec, read_group_spec, write_group_result
from lightning_hydro.sweeper.scaling_settings import ScalingSettings
from lightning_hydro.sweeper.trainer_factory import ConfigTrainerFactory

__all__ = ["apply_overrides", "fit_from_config"]

log = logging.getLogger(__name__)


def fit_from_config(cfg: DictConfig) -> dict[int, TrialResult]:
    """Build trial modules, data, Trainer and callbacks from ``cfg``, train them, return per-trial results.

    Args:
        cfg: the task config (``model``, ``data``, optional ``trainer``, ``callbacks``, ``seed``).

    Returns:
        ``{trial_id: {"status", "budget", "metrics", "history"}}``; a plain run has trial 0 only, and a
        probe job (``fusion_limit: auto``) returns ``{}`` after writing its measurement.

    Raises:
        ValueError: if the ``model`` or ``data`` section is missing or has no ``_target_``.
    """
    job_dir, sweep_dir = _job_dirs()
    spec = read_group_spec(sweep_dir) if sweep_dir is not None else None
    in_group = spec is not None
    if spec is None:
        spec = GroupSpec(group_id="run", kind="search", slots=1, trials=(TrialSpec(0),))
    _section(cfg, MODEL_KEY, "your LightningModule class, e.g. lightning_hydro.demos.DigitsMLP")
    trial_cfgs = {t.trial_id: apply_overrides(cfg, t.overrides) for t in spec.trials}
    datamodule = instantiate(
        _section(cfg, DATA_KEY, "your LightningDataModule, e.g. lightning_hydro.demos.DigitsDataModule")
    )
    seed = int(cfg.get(SEED_KEY, 0))
    # muP: search trials are width / ratio surrogates; the final retrain is the full-size target (ratio 1)
    scaling = ScalingSettings.from_config(cfg.get(SCALING_KEY), full_size=spec.kind == "retrain")

    def build_module(trial_id: int) -> L.LightningModule:
        # Every trial starts from the same seed: its init depends on its config only, not on its group.
        L.seed_everything(seed, verbose=False)
        return scaling.build(trial_cfgs[trial_id][MODEL_KEY])

    trainer_factory = ConfigTrainerFactory(_plain(cfg.get(TRAINER_KEY)), _plain(cfg.get(CALLBACKS_KEY)))
    trial_ids = [t.trial_id for t in spec.trials]
    if spec.kind == "probe":
        limit, probe = measure_fusion_limit(
            build_module, trial_ids, datamodule=datamodule, trainer_factory=trainer_factory, **spec.probe
        )
        write_group_result(job_dir, {"group_id": spec.group_id, "fusion_limit": limit, "probe": asdict(probe)})
        return {}
    results = fit_trials(
        build_module,
        trial_ids,
        slots=spec.slots,
        datamodule=datamodule,
        trainer_factory=trainer_factory,
        workdir=job_dir,
        early_stopping=spec.early_stopping,
        fused=FusedSettings(**_plain(cfg.get(FUSED_KEY))) if in_group else None,
    )
    for trial_id, result in results.items():
        log.info(
            "trial %d: %s after %d epochs, %s",
            trial_id,
            result["status"],
            result["budget"],
            result["metrics"],
        )
    if in_group and all(r["status"] != "running" for r in results.values()):  # else: resume it later
        write_group_result(
            job_dir,
            {
                "group_id": spec.group_id,
                "job_dir": str(job_dir),
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "trials": {str(k): v for k, v in results.items()},
            },
        )
    return results


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


def _job_dirs() -> tuple[Path, Path | None]:
    """The job's output directory, and the sweep directory its group spec would be in (outside Hydra: cwd)."""
    if not HydraConfig.initialized():
        return Path.cwd(), None
    hydra_cfg = HydraConfig.get()
    # A relative sweep dir is relative to where the app was started, not to the job's directory
    # (the job may have changed into it: hydra.job.chdir=true).
    return Path(hydra_cfg.runtime.output_dir), Path(hydra_cfg.runtime.cwd) / hydra_cfg.sweep.dir


def _section(cfg: DictConfig, key: str, what: str) -> DictConfig:
    node = cfg.get(key)
    if not isinstance(node, DictConfig) or "_target_" not in node:
        raise ValueError(
            f"fit_from_config: the config needs a '{key}' section with a _target_ ({what}), got {node!r}. "
            f"Fix: add '{key}: {{_target_: ...}}' to your config."
        )
    return node


def _plain(node: Any) -> dict[str, Any]:
    if node is None:
        return {}
    container = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    if not isinstance(container, dict):
        raise ValueError(f"fit_from_config: expected a mapping for trainer/callbacks, got {node!r}.")
    return {str(k): v for k, v in container.items()}
