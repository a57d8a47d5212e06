"""``fit_trials``: THE seam between the sweep and the training of one group's trials.

Everything around it (which trials, their modules, the data, the Trainer settings, where results go)
is decided by the sweeper and :func:`~lightning_hydro.sweeper.fit_from_config`; this one function trains.

Today it trains the trials one after another, each with an ordinary Lightning Trainer in its own
directory ``<job_dir>/trial_<id>/`` (logs, ``checkpoints/last.ckpt``, ``trial_result.json``), so a rerun
skips finished trials and resumes an interrupted one from its last checkpoint.

The fused core replaces the body: ``FusedLightningModule([build_module(t) for t in trial_ids[:slots]],
trial_ids=...)`` trained by ONE ``trainer_factory(root_dir=workdir, callbacks=[history, early_stopping])``
resumed from ``trainer_factory.last_checkpoint(workdir)``, where the early-stopping callback built from
``early_stopping`` frees slots and refills them with ``build_module(t)`` for the pending
``trial_ids[slots:]`` (the same partition), and returns ``fused.results`` plus each trial's history.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol, TypedDict

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_hydro.sweeper.group_spec import EarlyStoppingSpec
from lightning_hydro.sweeper.json_files import read_json, write_json_atomic
from lightning_hydro.sweeper.metric_history import MetricHistory, scalar_metrics

__all__ = ["TrainerFactory", "TrialResult", "TrialStatus", "fit_trials", "trial_dir"]

log = logging.getLogger(__name__)

TrialStatus = Literal["completed", "stopped", "diverged", "running"]
TRIAL_RESULT_FILE = "trial_result.json"


class TrialResult(TypedDict):
    """One trial's outcome (the format of the fused core's ``fused.results[trial_id]``, plus history).

    Attributes:
        status: ``completed`` (trained to the end), ``stopped`` (early stopping), ``diverged``
            (non-finite loss) or ``running`` (interrupted).
        budget: epochs trained.
        metrics: the latest value of each scalar metric the trial logged.
        history: one dict per epoch: ``epoch`` and each metric (the learning curve).
    """

    status: TrialStatus
    budget: int
    metrics: dict[str, float]
    history: list[dict[str, float]]


class TrainerFactory(Protocol):
    """Builds the Trainer of a training run rooted in ``root_dir`` (logs and checkpoints go there)."""

    def __call__(self, *, root_dir: Path, callbacks: Sequence[Callback] = ()) -> L.Trainer:
        """A Trainer with the app's settings and callbacks, plus ``callbacks``."""
        ...

    def last_checkpoint(self, root_dir: Path) -> Path | None:
        """The checkpoint to resume a run in ``root_dir`` from, if one was saved."""
        ...


def trial_dir(workdir: Path, trial_id: int) -> Path:
    """The directory of ``trial_id`` inside a job directory (sequential training)."""
    return workdir / f"trial_{trial_id:04d}"


def fit_trials(
    build_module: Callable[[int], L.LightningModule],
    trial_ids: Sequence[int],
    *,
    slots: int,
    datamodule: L.LightningDataModule,
    trainer_factory: TrainerFactory,
    workdir: Path,
    early_stopping: EarlyStoppingSpec | None = None,
) -> dict[int, TrialResult]:
    """Train the trials of one group and return each trial's result.

    Args:
        build_module: builds the (seeded) LightningModule of a trial id; called once per trial start.
        trial_ids: the group's trials, in start order; all belong to one partition (same shapes and data).
        slots: trials trained at once (the fused width); trials after the first ``slots`` wait for a
            slot that early stopping or completion frees.
        datamodule: the data, shared by all trials.
        trainer_factory: builds a Trainer rooted in a directory; resumable via ``last_checkpoint``.
        workdir: the job directory; every log and checkpoint goes under it.
        early_stopping: settings of the early-stopping callback; ``None`` or name ``none``: train every
            trial to the Trainer's ``max_epochs``.

    Returns:
        ``{trial_id: TrialResult}`` for every id in ``trial_ids``.

    Raises:
        NotImplementedError: for an early-stopping scheduler other than ``none`` (needs the callbacks).
    """
    if early_stopping is not None and early_stopping.name != "none":
        raise NotImplementedError(
            f"fit_trials: early stopping {early_stopping.name!r} needs lightning_hydro's early-stopping "
            "callbacks, which are not available in this build. Fix: set hydra.sweeper.scheduler.name=none."
        )
    if slots < 1:
        raise ValueError(f"fit_trials: slots must be >= 1, got {slots}.")
    return {tid: _fit_one(build_module, tid, datamodule, trainer_factory, workdir) for tid in trial_ids}


def _fit_one(
    build_module: Callable[[int], L.LightningModule],
    trial_id: int,
    datamodule: L.LightningDataModule,
    trainer_factory: TrainerFactory,
    workdir: Path,
) -> TrialResult:
    root = trial_dir(workdir, trial_id)
    done: TrialResult | None = read_json(root / TRIAL_RESULT_FILE)
    if done is not None:
        log.info("trial %d: finished before, not retrained (%s)", trial_id, root / TRIAL_RESULT_FILE)
        return done
    history, guard = MetricHistory(default_trial=trial_id), _DivergenceGuard()
    trainer = trainer_factory(root_dir=root, callbacks=[history, guard])
    checkpoint = trainer_factory.last_checkpoint(root)
    if checkpoint is not None:
        log.info("trial %d: resuming from %s", trial_id, checkpoint)
    trainer.fit(build_module(trial_id), datamodule=datamodule, ckpt_path=checkpoint)
    metrics = {**history.last(trial_id), **scalar_metrics(trainer.callback_metrics)}
    result = TrialResult(
        status=_status(trainer, guard),
        budget=int(trainer.current_epoch),
        metrics=metrics,
        history=history.of(trial_id),
    )
    if result["status"] != "running":
        write_json_atomic(root / TRIAL_RESULT_FILE, result)
    return result


def _status(trainer: L.Trainer, guard: _DivergenceGuard) -> TrialStatus:
    if trainer.interrupted:
        return "running"
    if guard.diverged:
        return "diverged"
    max_epochs = (
        trainer.max_epochs if trainer.max_epochs is not None and trainer.max_epochs >= 0 else math.inf
    )
    reached_epochs = trainer.current_epoch >= max_epochs
    reached_steps = trainer.max_steps >= 0 and trainer.global_step >= trainer.max_steps
    return "completed" if reached_epochs or reached_steps else "stopped"


class _DivergenceGuard(Callback):
    """Stops a trial whose training loss is not finite (the fused core isolates such trials itself)."""

    def __init__(self) -> None:
        self.diverged = False

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor) and not bool(torch.isfinite(loss).all()):
            self.diverged = True
            trainer.should_stop = True

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"diverged": self.diverged}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.diverged = bool(state_dict["diverged"])
