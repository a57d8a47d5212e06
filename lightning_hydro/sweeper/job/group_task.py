"""``GroupTask``: the user's task function, run as a sweep group's job.

The sweeper hands this wrapper, not the task function itself, to the configured launcher (it pickles like a
function, so joblib and submitit run it in their workers). In a group job it:

1. points the job's ``model`` node at the group's fused trials (:func:`~lightning_hydro.sweeper.job.group_model.
   rewrite_model_node`), so that a task function which instantiates ``cfg.model`` trains the whole group;
2. runs the task function unchanged (what it returns is passed on; the sweeper reads the group's results
   from ``group_result.json``, written by the fused module or by ``fit_from_config``);
3. on failure, writes the traceback to ``<job_dir>/job_error.txt`` and the job's log, with the group's
   overrides attached to the exception, and re-raises it;
4. raises :class:`GroupResultMissing` if the task function returned without the group's results;
5. on the rerun of an interrupted group, sets a top-level ``ckpt_path: null`` (lightning-hydra-template's
   resume key) to the group's latest fused ``last.ckpt``, so that the task function resumes the group;
6. where the sweeper dealt the job GPUs (:mod:`~lightning_hydro.sweeper.planning.device_plan`) and the job runs on GPUs,
   sets ``trainer.devices`` to them;
7. runs the task function in a :func:`~lightning_hydro.sweeper.job.rank_relaunch.job_scope`: DDP ranks that Lightning
   re-launches find their group, and the process is left without DDP's traces for the next job. Only global
   rank zero checks that the results were written (it writes them).

The sweeper's process imports this module to wrap the task function, and plans the sweep without torch or
Lightning: what a job needs of them (the group's model, Lightning's rank) is imported when a job runs.
"""

from __future__ import annotations

import logging
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from lightning_hydro.sweeper.app_config import TRAINER_KEY
from lightning_hydro.sweeper.group_spec import ERROR_FILE, RESULT_FILE, GroupSpec, job_dirs, read_group_spec
from lightning_hydro.sweeper.job.rank_relaunch import job_scope
from lightning_hydro.sweeper.planning.device_plan import assigned_trainer_devices

__all__ = ["GroupResultMissing", "GroupTask", "SweepMetricNotLogged", "keys_concerned"]

log = logging.getLogger(__name__)

CKPT_PATH_KEY = "ckpt_path"  # lightning-hydra-template's "resume fit from this checkpoint" key


class GroupResultMissing(RuntimeError):
    """A group job's task function returned without writing the group's ``group_result.json``."""


class GroupTask:
    """Wraps a Hydra task function for the jobs of a ``lightning_hydro`` sweep (see the module docstring).

    Args:
        task_function: the ``@hydra.main`` function of the app.
    """

    def __init__(self, task_function: Callable[[DictConfig], Any]) -> None:
        self.task_function = task_function

    def __call__(self, cfg: DictConfig) -> Any:
        """Run the task function on ``cfg`` as the job of its sweep group (a plain call outside one)."""
        job_dir, sweep_dir = job_dirs()
        spec = read_group_spec(sweep_dir) if sweep_dir is not None else None
        if spec is None or sweep_dir is None:
            return self.task_function(cfg)
        # In the job, not at import (see the module docstring): these load Lightning and torch.
        from lightning.pytorch.utilities import rank_zero_only

        from lightning_hydro.sweeper.job.group_model import built_groups, describe_trials, rewrite_model_node

        (job_dir / ERROR_FILE).unlink(missing_ok=True)  # from an earlier attempt of this group
        try:
            rewrite_model_node(cfg)
            _resume_from_last_checkpoint(cfg, job_dir)
            _use_assigned_devices(cfg, spec.group_id)
            with job_scope(sweep_dir):
                returned = self.task_function(cfg)
            if rank_zero_only.rank == 0 and not (job_dir / RESULT_FILE).is_file():  # type: ignore[attr-defined]
                raise GroupResultMissing(_missing_message(spec.group_id, built=spec.group_id in built_groups))
        except Exception as raised:
            err = _in_sweep_terms(raised, spec)
            err.add_note(f"lightning_hydro sweep group {spec.group_id} ({job_dir}): {describe_trials(spec)}")
            keys = keys_concerned(cfg, str(err))
            if keys:
                err.add_note(f"config keys it may concern: {', '.join(keys)}")
            text = "".join(traceback.format_exception(err))
            (job_dir / ERROR_FILE).write_text(text, encoding="utf-8")
            log.error("lightning_hydro: group %s failed (traceback also in %s):\n%s", spec.group_id, ERROR_FILE, text)
            if err is raised:
                raise
            raise err from raised
        return returned


class SweepMetricNotLogged(ValueError):
    """``hydra.sweeper.metric`` is not logged by a group's trials (the early stopping the sweeper added found it)."""


def _in_sweep_terms(err: Exception, spec: GroupSpec) -> Exception:
    """``err``, or, where the early stopping the sweeper built misses ``hydra.sweeper.metric``, an error saying so."""
    from lightning_hydro.callbacks.callback_arguments import MonitorNotLoggedError  # loads Lightning: in the job

    if not isinstance(err, MonitorNotLoggedError) or err.monitor != spec.early_stopping.metric:
        return err
    logged = ", ".join(repr(name) for name in err.logged) if err.logged else "nothing"
    return SweepMetricNotLogged(
        f"lightning_hydro sweeper: hydra.sweeper.metric={err.monitor!r} is not logged by the trials of group "
        f"{spec.group_id} ({err.when}); they log {logged}. Fix: set hydra.sweeper.metric to one of them (the name "
        "the module gives self.log, without '/trial_{id}') and re-run the same command (same hydra.sweep.dir): "
        "finished groups are kept."
    )


def _use_assigned_devices(cfg: DictConfig, group_id: str) -> None:
    """Set ``trainer.devices`` to the GPUs the sweeper dealt this job, if it runs on GPUs."""
    import torch

    block = assigned_trainer_devices(os.environ, torch.cuda.device_count())
    if block is None:
        return
    if not isinstance(cfg.get(TRAINER_KEY), DictConfig):
        log.warning("lightning_hydro: group %s was given GPUs %s; its config has no 'trainer' to set", group_id, block)
        return
    with open_dict(cfg):
        cfg[TRAINER_KEY].devices = block
    log.info("lightning_hydro: group %s runs on GPU(s) %s (trainer.devices)", group_id, block)


def _resume_from_last_checkpoint(cfg: DictConfig, job_dir: Path) -> None:
    """Point the template's ``ckpt_path`` (if the config has one, unset) at the group's latest ``last.ckpt``.

    A rerun of an interrupted group then resumes it where it stopped: the fused checkpoint that the user's
    ``ModelCheckpoint(save_last=True)`` writes holds every trial (per-trial copies are in ``trial_<id>/``).
    """
    if CKPT_PATH_KEY not in cfg or cfg[CKPT_PATH_KEY] is not None:
        return
    found = [p for p in job_dir.rglob("last.ckpt") if not p.parent.name.startswith("trial_")]
    if not found:
        return
    latest = max(found, key=lambda p: p.stat().st_mtime)
    with open_dict(cfg):
        cfg[CKPT_PATH_KEY] = str(latest)
    log.info("lightning_hydro: group resumes from %s (%s)", latest, CKPT_PATH_KEY)


def keys_concerned(cfg: DictConfig, message: str, limit: int = 5) -> list[str]:
    """Config keys that an error ``message`` names: a dotted key it contains, or a value it quotes.

    Example::

        >>> cfg = OmegaConf.create({"callbacks": {"stop": {"monitor": "val/acc"}}, "model": {"depth": 2}})
        >>> keys_concerned(cfg, "Early stopping conditioned on metric `val/acc` which is not available")
        ["callbacks.stop.monitor (= 'val/acc')"]
        >>> keys_concerned(cfg, "model.depth must be even")
        ['model.depth']
    """
    tree = OmegaConf.to_container(cfg, resolve=False)
    found: list[str] = []
    for key, value in _leaves(tree, ""):
        if len(key) > 3 and "." in key and key in message:
            found.append(key)
        elif isinstance(value, str) and len(value) >= 3 and any(f"{q}{value}{q}" in message for q in "'\"`"):
            found.append(f"{key} (= {value!r})")
    return found[:limit]


def _leaves(node: Any, prefix: str) -> list[tuple[str, Any]]:
    if isinstance(node, dict):
        return [leaf for k, v in node.items() for leaf in _leaves(v, f"{prefix}{k}.")]
    if isinstance(node, list):
        return [leaf for i, v in enumerate(node) for leaf in _leaves(v, f"{prefix}{i}.")]
    return [(prefix[:-1], node)]


def _missing_message(group_id: str, *, built: bool) -> str:
    if built:
        return (
            f"job {group_id}: the task function built the group's fused trials (hydra.utils.instantiate(cfg.model)) "
            f"but returned before their fit finished, so no {RESULT_FILE} was written. Expected: trainer.fit on "
            "that module until every trial is done (is training switched off, e.g. train=false, or was it "
            "interrupted?). A rerun of the same command retries this group."
        )
    return (
        f"job {group_id}: the task function returned without training the group's trials, so no {RESULT_FILE} "
        "was written. A lightning_hydro sweep trains each group as the module that the job's 'model' node "
        "instantiates. Fix: build your module with hydra.utils.instantiate(cfg.model) and pass it to "
        "trainer.fit (as lightning-hydra-template's train.py does), or return "
        "lightning_hydro.sweeper.fit_from_config(cfg) from your task function."
    )
