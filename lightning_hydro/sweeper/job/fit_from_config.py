"""``fit_from_config``: what a Hydra task function calls to train from its config, alone or in a sweep.

In a plain run (``python train.py``) it trains the config's model once (trial 0). In a job launched by
the ``lightning_hydro`` sweeper it reads its group's spec (see :mod:`~lightning_hydro.sweeper.group_spec`),
builds one module per trial (the job's config with the trial's overrides), and trains them all through
:func:`~lightning_hydro.sweeper.job.fit_trials.fit_trials`. Its config layout is described in
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
import random
import socket
from dataclasses import asdict
from pathlib import Path
from typing import Any

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from lightning_hydro.stopping import TrialResult
from lightning_hydro.sweeper.app_config import (
    CALLBACKS_KEY,
    DATA_KEY,
    FUSED_KEY,
    LOGGER_KEY,
    MODEL_KEY,
    SCALING_KEY,
    SEED_KEY,
    TRAINER_KEY,
    config_section,
)
from lightning_hydro.sweeper.group_spec import (
    STATE_DIR,
    GroupSpec,
    TrialSpec,
    job_dirs,
    read_group_spec,
    write_group_result,
)
from lightning_hydro.sweeper.job.backend_cache import BACKEND_FILE, BackendCache
from lightning_hydro.sweeper.job.fit_trials import FusedSettings, fit_trials
from lightning_hydro.sweeper.job.group_model import restore_model_node
from lightning_hydro.sweeper.job.group_search import GroupSearch
from lightning_hydro.sweeper.job.overrides import apply_overrides
from lightning_hydro.sweeper.job.scaling_settings import ScalingSettings
from lightning_hydro.sweeper.job.trainer_factory import ConfigTrainerFactory
from lightning_hydro.sweeper.planning.device_plan import DEVICES_ENV
from lightning_hydro.sweeper.planning.fusion_limit import measure_fusion_limit

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
    job_dir, sweep_dir = job_dirs()
    spec = read_group_spec(sweep_dir) if sweep_dir is not None else None
    in_group = spec is not None
    if spec is None:
        spec = GroupSpec(group_id="run", kind="search", slots=1, trials=(TrialSpec(0),))
    cfg = copy.deepcopy(cfg)
    restore_model_node(cfg)  # a sweep job's model node builds the fused group for task functions of their own
    _section(cfg, MODEL_KEY, "your LightningModule class, e.g. lightning_hydro.demos.DigitsMLP")
    trial_cfgs = {t.trial_id: apply_overrides(cfg, t.overrides) for t in spec.trials}
    datamodule = instantiate(
        _section(cfg, DATA_KEY, "your LightningDataModule, e.g. lightning_hydro.demos.DigitsDataModule")
    )
    seeds = {t.trial_id: _trial_seed(cfg, t) for t in spec.trials}
    # muP: search trials are width / ratio surrogates; the final retrain is the full-size target (ratio 1)
    scaling = ScalingSettings.from_config(cfg.get(SCALING_KEY), full_size=spec.kind == "retrain")

    search = GroupSearch.from_spec(spec.search, job_dir) if in_group else None

    def build_module(trial_id: int) -> L.LightningModule:
        if trial_id not in trial_cfgs and search is not None:  # a trial the job asked of the sweep's sampler
            trial_cfgs[trial_id] = apply_overrides(cfg, search.overrides(trial_id) or [])
            seeds[trial_id] = search.seed(trial_id)
        # Each trial starts from its own seed: its init depends on its config only, not on its group.
        L.seed_everything(seeds[trial_id], verbose=False)
        return scaling.build(trial_cfgs[trial_id][MODEL_KEY])

    trainer_kwargs = _settings(cfg, TRAINER_KEY)
    root = trainer_kwargs.pop("default_root_dir", None)  # the template's ${paths.output_dir}: the runs go there
    workdir = Path(root) if root else job_dir
    trainer_factory = ConfigTrainerFactory(
        trainer_kwargs, _settings(cfg, CALLBACKS_KEY), loggers=_settings(cfg, LOGGER_KEY)
    )
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
        workdir=workdir,
        early_stopping=spec.early_stopping,
        fused=FusedSettings(**{**spec.fused, **_settings(cfg, FUSED_KEY)}) if in_group else None,
        search=search,
        backend_cache=BackendCache(sweep_dir / STATE_DIR / BACKEND_FILE) if in_group and sweep_dir else None,
    )
    # a further DDP rank of the group's fit: rank zero reports and writes the results
    if rank_zero_only.rank != 0:  # type: ignore[attr-defined]
        return results
    for trial_id, result in results.items():
        log.info(
            "trial %d (seed %d): %s after %d epochs, %s",
            trial_id,
            seeds[trial_id],
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
                "devices": os.environ.get(DEVICES_ENV),  # the GPUs the sweeper dealt the job (device_plan.py)
                "trials": {str(k): {**v, "seed": seeds[k]} for k, v in results.items()},
            },
        )
    return results


def _trial_seed(cfg: DictConfig, trial: TrialSpec) -> int:
    """The sweep's seed for the trial, else the config's ``seed`` (default 0), else (``seed: null``) a fresh one."""
    if trial.seed is not None:
        return trial.seed
    seed = cfg.get(SEED_KEY, 0)
    if seed is None:
        seed = random.SystemRandom().randrange(2**31 - 1)
        log.info("seed: null, so trial %d is seeded with %d (rerun it with seed=%d)", trial.trial_id, seed, seed)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"fit_from_config: 'seed' must be an integer or null, got {seed!r}. Fix: e.g. seed=42.")
    return seed


def _section(cfg: DictConfig, key: str, what: str) -> DictConfig:
    node = cfg.get(key)
    if not isinstance(node, DictConfig) or "_target_" not in node:
        raise ValueError(
            f"fit_from_config: the config needs a '{key}' section with a _target_ ({what}), got {node!r}. "
            f"Fix: add '{key}: {{_target_: ...}}' to your config."
        )
    return node


def _settings(cfg: DictConfig, key: str) -> dict[str, Any]:
    """A section of keyword arguments (``trainer``, ``callbacks``, ``logger``, ``fused``) as a plain dict."""
    return config_section(cfg.get(key), what=f"fit_from_config: the config's '{key}'")
