"""``SweepGroupModule``: a sweep group's fused trials, trained by the user's own Trainer and task function.

It is what the job's rewritten ``model`` node instantiates (see :mod:`~lightning_hydro.sweeper.group_model`).
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
from lightning_hydro.sweeper.early_stopping import REFILLING, build_stopping_callback
from lightning_hydro.sweeper.group_spec import GroupSpec, read_group_result, write_group_result

__all__ = ["GroupResultWriter", "SweepGroupModule"]


class SweepGroupModule(FusedLightningModule):
    """A :class:`~lightning_hydro.FusedLightningModule` that records its sweep group's results itself.

    Args:
        trials: the first trial modules (one per slot).
        spec: the group's spec (trials, slots, early stopping).
        build_trial: builds (seeded) the module of any trial id of the group; refills and resumes use it.
        job_dir: where ``group_result.json`` goes.
        **kwargs: the rest of :class:`~lightning_hydro.FusedLightningModule`'s arguments.
    """

    def __init__(
        self,
        trials: list[L.LightningModule],
        *,
        spec: GroupSpec,
        build_trial: Callable[[int], L.LightningModule],
        job_dir: Path,
        **kwargs: Any,
    ) -> None:
        super().__init__(trials, trial_factory=build_trial, **kwargs)
        self.spec = spec
        self.job_dir = job_dir
        self._build_trial = build_trial

    @classmethod
    def for_group(
        cls, spec: GroupSpec, build_trial: Callable[[int], L.LightningModule], *, job_dir: Path
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
        first = ids[: spec.slots]
        return cls(
            [build_trial(t) for t in first],
            spec=spec,
            build_trial=build_trial,
            job_dir=job_dir,
            trial_ids=first,
            max_slots=spec.slots,
            backend=spec.fused.get("backend", "auto"),
            optimizer_path=spec.fused.get("optimizer_path", "auto"),
            deterministic=bool(spec.fused.get("deterministic", False)),
            pad_widths=bool(spec.fused.get("pad_widths", False)),
            monitor=spec.early_stopping.metric,
            mode="max" if spec.early_stopping.mode == "max" else "min",
        )

    @override
    def configure_callbacks(self) -> list[Callback]:
        callbacks: list[Callback] = [*super().configure_callbacks(), GroupResultWriter(self.spec, self.job_dir)]
        stopping = self.spec.early_stopping
        if stopping.name == "none" or self.trainer.state.fn != TrainerFn.FITTING:
            return callbacks
        configured = self.trainer.max_epochs if self.trainer.max_epochs and self.trainer.max_epochs > 0 else 10
        max_t = stopping.max_budget or configured
        pending = [t.trial_id for t in self.spec.trials if t.trial_id not in self.results]
        refill = ((t, self._build_trial(t)) for t in pending) if pending else None
        if pending:  # the group ends when its last trial does, not at max_epochs
            self.trainer.fit_loop.max_epochs = max_t * len(self.spec.trials)
        callbacks.append(build_stopping_callback(stopping, max_t=max_t, refill=refill))
        return callbacks


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
            seeds = {t.trial_id: t.seed for t in self.spec.trials}
            trials = {
                str(tid): {
                    "status": r["status"],
                    "budget": r["budget"],
                    "budget_unit": r.get("budget_unit", "epochs"),
                    "metrics": r["metrics"],
                    "history": r["history"],
                    "seed": seeds.get(tid),
                }
                for tid, r in results.items()
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
