"""The ``model`` node of a sweep job: instantiating it builds the group's trials as one fused module.

A project's own task function (lightning-hydra-template's ``train.py``: ``hydra.utils.instantiate(cfg.model)``,
then ``trainer.fit``) sweeps unchanged: in a group job, :class:`~lightning_hydro.sweeper.job.group_task.GroupTask`
rewrites the job's ``model`` node before the task function sees it, keeping every key and interpolation in
place and only redirecting its ``_target_``:

.. code-block:: yaml

    model:
      _target_: lightning_hydro.sweeper.job.group_model.fused_group_model   # was src.models.MNISTLitModule
      _trial_target_: src.models.MNISTLitModule
      _recursive_: false
      net: {_target_: ..., lin1_size: 64}   # untouched: each trial's overrides are applied to this node
      optimizer: {_target_: torch.optim.Adam, _partial_: true, lr: 0.001}

:func:`fused_group_model` then builds each trial's module from the node with the trial's overrides (each
seeded with the trial's seed) and returns them as one :class:`~lightning_hydro.sweeper.job.sweep_group_module.
SweepGroupModule`, which records the group's results when fit ends.

Example::

    >>> cfg = OmegaConf.create({"model": {"_target_": "my.Module", "lr": 0.1}})
    >>> rewrite_model_node(cfg)
    >>> cfg.model._target_ == GROUP_MODEL_TARGET, cfg.model._trial_target_
    (True, 'my.Module')
    >>> restore_model_node(cfg)
    >>> cfg.model
    {'_target_': 'my.Module', 'lr': 0.1}
"""

from __future__ import annotations

from typing import Any

import lightning as L
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from lightning_hydro._deprecation import Renamed, renamed_names
from lightning_hydro.stacking import ArchitectureMismatchError
from lightning_hydro.sweeper.app_config import MODEL_KEY
from lightning_hydro.sweeper.group_spec import STATE_DIR, GroupSpec, job_dirs, read_group_spec
from lightning_hydro.sweeper.job.backend_cache import BACKEND_FILE, BackendCache
from lightning_hydro.sweeper.job.group_search import GroupSearch
from lightning_hydro.sweeper.job.overrides import apply_overrides
from lightning_hydro.sweeper.planning.search_space import override_key

__all__ = [
    "GROUP_MODEL_TARGET",
    "TRIAL_TARGET_KEY",
    "built_groups",
    "describe_trials",
    "differing_keys",
    "fused_group_model",
    "restore_model_node",
    "rewrite_model_node",
]

__getattr__ = renamed_names(
    __name__,
    {
        "trial_seed": Renamed(
            "lightning_hydro.sweeper.group_spec:trial_seed",
            "moved to lightning_hydro.sweeper.group_spec.trial_seed (the contract: both sides seed trials with it); "
            "import it from there",
        )
    },
)

GROUP_MODEL_TARGET = "lightning_hydro.sweeper.job.group_model.fused_group_model"
built_groups: set[str] = set()
"""Ids of the groups whose fused module this process built (a job's wrapper checks it when results lack)."""
TRIAL_TARGET_KEY = "_trial_target_"
_RECURSIVE = "_recursive_"


def rewrite_model_node(cfg: DictConfig) -> None:
    """Point ``cfg.model`` at :func:`fused_group_model` (in place; idempotent).

    Raises:
        ValueError: if ``cfg`` has no ``model`` node with a ``_target_``.
    """
    node = cfg.get(MODEL_KEY)
    if not isinstance(node, DictConfig) or "_target_" not in node:
        raise ValueError(
            f"lightning_hydro sweeper: the config's '{MODEL_KEY}' node must be an instantiable LightningModule "
            f"config (with a _target_), got {node!r}. The group's trials are built from it. Fix: put your "
            f"module's config under '{MODEL_KEY}' with its class as _target_."
        )
    if node["_target_"] == GROUP_MODEL_TARGET:
        return
    with read_write(node), open_dict(node):
        node[TRIAL_TARGET_KEY] = node["_target_"]
        node["_target_"] = GROUP_MODEL_TARGET
        node[_RECURSIVE] = False


def restore_model_node(cfg: DictConfig) -> None:
    """Undo :func:`rewrite_model_node` (in place): the user's own ``model`` node, for ``fit_from_config``."""
    node = cfg.get(MODEL_KEY)
    if not isinstance(node, DictConfig) or node.get("_target_") != GROUP_MODEL_TARGET:
        return
    with read_write(node), open_dict(node):
        node["_target_"] = node.pop(TRIAL_TARGET_KEY)
        node.pop(_RECURSIVE, None)


def fused_group_model(**node: Any) -> L.LightningModule:
    """Build the group job's trials from its (rewritten) ``model`` node, fused; Hydra calls this.

    Outside a sweep group (``python train.py`` with a rewritten node) it builds the user's module.

    Raises:
        ValueError: if the node lacks its original target, or if the group's trials cannot fuse (the
            message names the trials' differing overrides and the fix).
    """
    from lightning_hydro.sweeper.job.sweep_group_module import SweepGroupModule

    target = node.pop(TRIAL_TARGET_KEY, None)
    if not isinstance(target, str):
        raise ValueError(
            f"fused_group_model: the model node has no {TRIAL_TARGET_KEY} (the module class), got {target!r}. "
            "It is written by the lightning_hydro sweeper; do not set model._target_ to it yourself."
        )
    base = OmegaConf.create({MODEL_KEY: {"_target_": target, **node}}, flags={"allow_objects": True})
    job_dir, sweep_dir = job_dirs()
    spec = read_group_spec(sweep_dir) if sweep_dir is not None else None
    if spec is None:
        return instantiate(base[MODEL_KEY])
    if spec.kind == "probe":
        raise ValueError(
            "lightning_hydro sweeper: hydra.sweeper.fusion_limit=auto measures memory in a probe job run by "
            "fit_from_config; your own task function cannot run it. Fix: set hydra.sweeper.fusion_limit to a "
            "number (e.g. 8)."
        )
    trial_cfgs = {t.trial_id: apply_overrides(base, t.overrides) for t in spec.trials}
    seeds: dict[int, int | None] = {t.trial_id: t.seed for t in spec.trials}

    search = GroupSearch.from_spec(spec.search, job_dir)

    def build_trial(trial_id: int) -> L.LightningModule:
        if trial_id not in trial_cfgs and search is not None:  # a trial the job asked of the sweep's sampler
            trial_cfgs[trial_id] = apply_overrides(base, search.overrides(trial_id) or [])
            seeds[trial_id] = search.seed(trial_id)
        if seeds[trial_id] is not None:
            L.seed_everything(seeds[trial_id], verbose=False)
        return instantiate(trial_cfgs[trial_id][MODEL_KEY])

    try:
        assert sweep_dir is not None
        cache = BackendCache(sweep_dir / STATE_DIR / BACKEND_FILE)
        module = SweepGroupModule.for_group(spec, build_trial, job_dir=job_dir, search=search, backend_cache=cache)
    except ArchitectureMismatchError as err:
        keys = differing_keys(spec)
        outcome = (
            "with hydra.sweeper.pad_widths=true (the default) trials that differ only in integer sizes under "
            "model. then share groups, zero-padded; other values get groups of their own"
            if err.differing_sizes
            else "each value then gets groups of its own"
        )
        raise ArchitectureMismatchError(
            f"lightning_hydro sweeper: the trials of group {spec.group_id} cannot train as one model: they "
            f"differ in {', '.join(keys) or 'no searched key'}, and their modules' shapes differ. {err} Fix: "
            f"declare {keys or 'the shape-changing keys'} in hydra.sweeper.non_fusible ({outcome}).",
            differing_sizes=err.differing_sizes,
        ) from err
    built_groups.add(spec.group_id)
    return module


def differing_keys(spec: GroupSpec) -> list[str]:
    """The override keys whose values differ between the group's trials."""
    values: dict[str, set[str]] = {}
    for trial in spec.trials:
        for line in trial.overrides:
            values.setdefault(override_key(line), set()).add(line.partition("=")[2])
    return [key for key, seen in values.items() if len(seen) > 1]


def describe_trials(spec: GroupSpec) -> str:
    """The group's trials and their overrides, for error messages."""
    return "; ".join(f"trial {t.trial_id}: {' '.join(t.overrides) or '(no overrides)'}" for t in spec.trials)
