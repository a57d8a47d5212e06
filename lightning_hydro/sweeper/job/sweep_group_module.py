"""``SweepGroupModule``: a sweep group's fused trials, trained by the user's own Trainer and task function.

It is what the job's rewritten ``model`` node instantiates (see :mod:`~lightning_hydro.sweeper.job.group_model`).
Through ``configure_callbacks`` it brings what the group needs to whatever Trainer the task function builds,
next to the user's own callbacks and loggers:

- :class:`GroupResultWriter` writes ``<job_dir>/group_result.json`` when fit ends with every trial
  finished, and adds the test metrics when ``trainer.test`` follows;
- the early-stopping callback of ``hydra.sweeper.scheduler`` (its freed slots refilled from the group's
  waiting trials).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

from lightning_hydro.fused import FusedLightningModule
from lightning_hydro.stopping import TrialResult
from lightning_hydro.sweeper.group_spec import GroupSpec, read_group_result, write_group_result
from lightning_hydro.sweeper.job.backend_cache import BackendCache, model_signature
from lightning_hydro.sweeper.job.early_stopping import REFILLING, build_stopping_callback
from lightning_hydro.sweeper.job.group_search import GroupSearch, group_stopping
from lightning_hydro.sweeper.job.trial_builder import TrialBuilder

__all__ = ["GroupResultWriter", "SweepGroupModule"]


class SweepGroupModule(FusedLightningModule):
    """A :class:`~lightning_hydro.FusedLightningModule` that records its sweep group's results itself.

    Args:
        trials: the first trial modules (one per slot).
        spec: the group's spec (trials, slots, early stopping).
        build_trial: builds (seeded) the module of any trial id of the group; refills and resumes use it.
        job_dir: where ``group_result.json`` goes.
        search: the group's part in the sweep-wide search (new trials for freed slots from the sweep's
            sampler, up to the group's quota), or ``None``.
        **kwargs: the rest of :class:`~lightning_hydro.FusedLightningModule`'s arguments.
    """

    def __init__(
        self,
        trials: list[L.LightningModule],
        *,
        spec: GroupSpec,
        build_trial: Callable[[int], L.LightningModule],
        job_dir: Path,
        search: GroupSearch | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(trials, trial_factory=build_trial, **kwargs)
        self.spec = spec
        self.job_dir = job_dir
        self.search = search
        self.backend_record: tuple[BackendCache, str] | None = None
        self._build_trial = build_trial
        self.builder = TrialBuilder(build_trial)  # builds refills; records the trials whose module raised

    @classmethod
    def for_group(
        cls,
        spec: GroupSpec,
        build_trial: Callable[[int], L.LightningModule],
        *,
        job_dir: Path,
        search: GroupSearch | None = None,
        backend_cache: BackendCache | None = None,
    ) -> SweepGroupModule:
        """The group's first ``spec.slots`` trials, fused; the others wait for a slot that early stopping frees.

        Raises:
            ValueError: if the group has more trials than slots but its early stopping cannot refill.
        """
        ids = [t.trial_id for t in spec.trials]
        stopping = spec.early_stopping.name
        if len(ids) > spec.slots and stopping not in REFILLING:
            raise ValueError(
                f"lightning_hydro sweeper: group {spec.group_id} has {len(ids)} trials for {spec.slots} slots, "
                f"and scheduler {stopping!r} does not start waiting trials in freed slots; one trainer.fit of "
                "your task function cannot train them in rounds. Fix: hydra.sweeper.scheduler.refill=false "
                "(groups of at most fusion_limit trials), or a refilling scheduler (asha, hyperband, deadline)."
            )
        builder = TrialBuilder(build_trial)  # a trial whose module cannot be built fails alone
        started = [drawn for _, drawn in zip(range(spec.slots), builder.buildable(ids))]
        if not started:
            errors = "; ".join(f"trial {tid}: {r.get('error', '')}" for tid, r in builder.failed.items())
            raise RuntimeError(
                f"lightning_hydro sweeper: no trial of group {spec.group_id} could build its module ({errors})."
            )
        first, modules = [tid for tid, _ in started], [module for _, module in started]
        configured = str(spec.fused.get("backend", "auto"))
        deterministic = bool(spec.fused.get("deterministic", False))
        signature = model_signature(modules[0])
        cached = None if backend_cache is None or deterministic else backend_cache.backend_for(signature, configured)
        module = cls(
            modules,
            spec=spec,
            build_trial=build_trial,
            job_dir=job_dir,
            search=search,
            trial_ids=first,
            max_slots=spec.slots,
            backend=cached or configured,
            optimizer_path=spec.fused.get("optimizer_path", "auto"),
            deterministic=deterministic,
            compile=spec.fused.get("compile", False),
            pad_widths=bool(spec.fused.get("pad_widths", False)),
            monitor=spec.early_stopping.metric,
            mode="max" if spec.early_stopping.mode == "max" else "min",
        )
        module.builder = builder  # (it holds the trials that failed)
        if backend_cache is not None and configured == "auto" and not deterministic:
            module.backend_record = (backend_cache, signature)  # the writer records what the group ran on
        return module

    @property
    def failed_trials(self) -> dict[int, TrialResult]:
        """The trials whose module raised when built (status ``failed``, with the error): they never joined."""
        return self.builder.failed

    @override
    def configure_callbacks(self) -> list[Callback]:
        callbacks: list[Callback] = [*super().configure_callbacks(), GroupResultWriter(self.spec, self.job_dir)]
        stopping = self.spec.early_stopping
        if stopping.name == "none" or self.trainer.state.fn != TrainerFn.FITTING:
            return callbacks
        configured = self.trainer.max_epochs if self.trainer.max_epochs and self.trainer.max_epochs > 0 else 10
        max_t = stopping.max_t or configured
        pending = [t.trial_id for t in self.spec.trials if t.trial_id not in self.results]
        pending = [tid for tid in pending if tid not in self.failed_trials]
        refill: Any = self.builder.buildable(pending) if pending else None  # a refill that raises fails alone
        planned = len(self.spec.trials)
        if self.search is not None:  # waiting trials first, then new ones asked of the sweep's sampler
            # (draw i is the same trial in a resumed fit: the waiting trials are those after the first slots)
            waiting = [t.trial_id for t in self.spec.trials[self.spec.slots :]]
            refill, planned = self.search.refill(waiting, self._build_trial), max(planned, self.search.quota)
        if refill is not None:  # the group ends when its last trial does, not at max_epochs
            self.trainer.fit_loop.max_epochs = max_t * planned
        store, after = group_stopping(stopping, self.search)
        callbacks.append(build_stopping_callback(stopping, max_t=max_t, refill=refill, storage=store))
        return [*callbacks, *after]


class GroupResultWriter(Callback):
    """Writes the group's per-trial results into ``<job_dir>/group_result.json``, which the sweeper reads.

    After ``fit`` (only when no trial is left running: an interrupted group is retrained by a rerun) and
    again after ``test`` or ``validate``, whose per-trial metrics it adds.
    """

    def __init__(self, spec: GroupSpec, job_dir: Path) -> None:
        self.spec = spec
        self.job_dir = job_dir

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not trainer.is_global_zero or not isinstance(pl_module, FusedLightningModule):
            return
        results = pl_module.results
        previous = read_group_result(self.job_dir)
        if stage == "fit":
            if trainer.interrupted or any(r["status"] == "running" for r in results.values()):
                return  # unfinished: no result, so that a rerun retrains the group
            if isinstance(pl_module, SweepGroupModule) and pl_module.backend_record is not None:
                cache, signature = pl_module.backend_record
                cache.record(signature, (str(r.get("backend", "")) for r in results.values()))
            seeds = {t.trial_id: t.seed for t in self.spec.trials}
            search = pl_module.search if isinstance(pl_module, SweepGroupModule) else None
            if search is not None:  # trials the job asked of the sweep's sampler: seeded as the sweeper seeds
                seeds.update({tid: search.seed(tid) for tid in results if tid not in seeds})
            trials = {
                str(tid): {
                    "status": r["status"],
                    "budget": r["budget"],
                    "budget_unit": r.get("budget_unit", "epochs"),
                    "metrics": r["metrics"],
                    "history": r["history"],
                    "seed": seeds.get(tid),
                    "backend": r.get("backend", ""),  # what the group ran on, for results.json/csv
                }
                for tid, r in results.items()
            }
            failed = pl_module.failed_trials if isinstance(pl_module, SweepGroupModule) else {}
            for tid, r in failed.items():  # never joined: failed alone, with the error its module raised
                trials[str(tid)] = {
                    "status": "failed",
                    "budget": 0,
                    "budget_unit": "epochs",
                    "metrics": {},
                    "history": [],
                    "seed": seeds.get(tid),
                    "backend": "",
                    "error": r.get("error", ""),
                }
        elif previous is not None:
            # test/validate after fit (perhaps from a checkpoint, whose records are older): keep what fit
            # recorded, and add the metrics it did not log (test/acc, ...)
            trials = previous["trials"]
            for tid, r in results.items():
                old = trials.get(str(tid))
                if old is not None:
                    old["metrics"].update({k: v for k, v in r["metrics"].items() if k not in old["metrics"]})
        else:
            return  # a test without a finished fit before it: nothing to add to
        write_group_result(
            self.job_dir,
            {
                "group_id": self.spec.group_id,
                "job_dir": str(self.job_dir),
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "trials": trials,
            },
        )
