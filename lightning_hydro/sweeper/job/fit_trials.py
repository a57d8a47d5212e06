"""``fit_trials``: the one function that trains a group's trials, fused.

Everything around it (which trials, their modules, the data, the Trainer settings, where results go)
is decided by the sweeper and :func:`~lightning_hydro.sweeper.fit_from_config`; this one function trains.

In a sweep job (``fused`` settings given) the group's trials train as ONE
:class:`~lightning_hydro.FusedLightningModule` of ``slots`` trials, by one Trainer rooted in
``<job_dir>/fused_<k>/`` (logs, ``checkpoints/last.ckpt``, ``group_fit.json``); with early stopping the
callback frees slots and refills them from the group's pending trials, otherwise the pending trials train
as the next fused round. A rerun skips finished rounds and resumes an interrupted one from its checkpoint.

In a plain run (``python train.py``, no ``fused`` settings) the trial trains as an ordinary
LightningModule in ``<job_dir>/trial_<id>/``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from lightning_hydro.stopping import TrialResult, TrialStatus
from lightning_hydro.sweeper.group_spec import EarlyStoppingSpec
from lightning_hydro.sweeper.job.backend_cache import BackendCache, model_signature
from lightning_hydro.sweeper.job.early_stopping import REFILLING, build_stopping_callback
from lightning_hydro.sweeper.job.group_search import GroupSearch, group_stopping
from lightning_hydro.sweeper.job.metric_history import MetricHistory, scalar_metrics
from lightning_hydro.sweeper.job.trial_builder import TrialBuilder
from lightning_hydro.sweeper.json_files import read_json_or_redo, write_json_atomic

__all__ = ["FusedSettings", "TrainerFactory", "fit_trials", "trial_dir"]

log = logging.getLogger(__name__)

TRIAL_RESULT_FILE = "trial_result.json"
ROUND_RESULT_FILE = "group_fit.json"
_REDO = "its trials train again (from their last checkpoint, if it is readable)"


@dataclass(frozen=True)
class FusedSettings:
    """How a sweep job fuses its trials (the app config's optional ``fused`` section).

    Attributes:
        backend: ``auto``, ``vmap``, ``hfta`` or ``loop`` (see ``FusedLightningModule``).
        optimizer_path: ``auto``, ``universal`` or ``fused``.
        deterministic: with ``auto``, choose the backend without timing (``FusedLightningModule``'s
            ``deterministic``), so that a rerun computes the same numbers on a busier machine.
        compile: ``False``, ``True`` or ``"reduce-overhead"`` (``FusedLightningModule``'s ``compile``).
        pad_widths: fuse trials whose hidden sizes differ, zero-padded (``FusedLightningModule``'s
            ``pad_widths``); refills of any width fit in.
    """

    backend: str = "auto"
    optimizer_path: str = "auto"
    deterministic: bool = False
    compile: bool | str = False
    pad_widths: bool = False


class TrainerFactory(Protocol):
    """Builds the Trainer of a training run rooted in ``root_dir`` (logs and checkpoints go there)."""

    def __call__(self, *, root_dir: Path, callbacks: Sequence[Callback] = (), **overrides: Any) -> L.Trainer:
        """A Trainer with the app's settings (``overrides`` win) and callbacks, plus ``callbacks``."""
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
    fused: FusedSettings | None = None,
    search: GroupSearch | None = None,
    backend_cache: BackendCache | None = None,
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
        fused: train the trials fused with these settings; ``None``: one ordinary run per trial.
        search: the group's part in the sweep-wide search: once its waiting trials have started, freed
            slots take new trials asked of the sweep's sampler, up to the group's quota (``build_module``
            must build those ids too). ``None``: the group's own trials only.
        backend_cache: the sweep's record of the backend each model ran on: with ``backend="auto"``, a model
            that an earlier group ran runs on the same backend, untimed; a new one is timed and recorded.

    Returns:
        ``{trial_id: TrialResult}`` for every id in ``trial_ids``.

    Raises:
        ValueError: ``slots`` < 1; early stopping without fused settings (a plain run has one trial).
    """
    if slots < 1:
        raise ValueError(f"fit_trials: slots must be >= 1, got {slots}.")
    stopping = early_stopping if early_stopping is not None and early_stopping.name != "none" else None
    if fused is None:
        if stopping is not None:
            raise ValueError(
                f"fit_trials: early stopping {stopping.name!r} decides between the trials of a fused group; "
                "a plain run trains one trial. Fix: run it as a sweep (-m), or set scheduler.name=none."
            )
        return {tid: _fit_one(build_module, tid, datamodule, trainer_factory, workdir) for tid in trial_ids}
    ids = list(trial_ids)
    if stopping is not None and stopping.name in REFILLING:
        # one fused group; slots freed by early stopping are refilled from the pending trials, in order
        root = workdir / "fused_0"
        return _fit_fused(
            build_module, ids, slots, datamodule, trainer_factory, root, fused, stopping, search, backend_cache
        )
    results: dict[int, TrialResult] = {}
    for round_index, start in enumerate(range(0, len(ids), slots)):
        round_ids = ids[start : start + slots]
        root = workdir / f"fused_{round_index}"
        results.update(
            _fit_fused(
                build_module, round_ids, slots, datamodule, trainer_factory, root, fused, stopping, None, backend_cache
            )
        )
    return results


def _fit_fused(
    build_module: Callable[[int], L.LightningModule],
    trial_ids: list[int],
    slots: int,
    datamodule: L.LightningDataModule,
    trainer_factory: TrainerFactory,
    root: Path,
    settings: FusedSettings,
    stopping: EarlyStoppingSpec | None,
    search: GroupSearch | None = None,
    backend_cache: BackendCache | None = None,
) -> dict[int, TrialResult]:
    """Train ``trial_ids`` as one fused group of ``slots`` slots; trials beyond them refill freed slots."""
    from lightning_hydro.fused import FusedLightningModule

    done: dict[str, TrialResult] | None = read_json_or_redo(root / ROUND_RESULT_FILE, _REDO)
    if done is not None:
        log.info("trials %s: finished before, not retrained (%s)", trial_ids, root / ROUND_RESULT_FILE)
        return {int(k): v for k, v in done.items()}
    builder = TrialBuilder(build_module)
    pending = iter(builder.buildable(trial_ids))  # a trial whose module cannot be built fails alone
    started = [drawn for _, drawn in zip(range(slots), pending)]
    if not started:  # every trial failed to build
        write_json_atomic(root / ROUND_RESULT_FILE, {str(k): v for k, v in builder.failed.items()})
        return dict(builder.failed)
    first = [tid for tid, _ in started]
    signature = model_signature(started[0][1])
    use_cache = backend_cache is not None and not settings.deterministic  # deterministic: never by timing
    cached = backend_cache.backend_for(signature, settings.backend) if backend_cache and use_cache else None
    fused = FusedLightningModule(
        [module for _, module in started],
        trial_ids=first,
        max_slots=slots,
        backend=cached or settings.backend,  # type: ignore[arg-type]
        optimizer_path=settings.optimizer_path,  # type: ignore[arg-type]
        trial_factory=build_module,
        deterministic=settings.deterministic,
        compile=settings.compile,  # type: ignore[arg-type]
        pad_widths=settings.pad_widths,
    )
    callbacks: list[Callback] = []
    overrides: dict[str, Any] = {}
    if stopping is not None:
        configured = (
            trainer_factory.trainer_kwargs.get("max_epochs") if hasattr(trainer_factory, "trainer_kwargs") else None
        )
        max_t = stopping.max_t or int(configured or 10)
        unstarted = len(trial_ids) - len(first) - len(builder.failed)
        refill: Any = pending if unstarted else None
        planned = len(trial_ids)
        if search is not None:  # waiting trials first, then new ones asked of the sweep's sampler
            refill = search.refill(trial_ids[trial_ids.index(first[-1]) + 1 :], build_module)
            planned = max(planned, search.quota)
        store, after = group_stopping(stopping, search)
        callbacks.append(build_stopping_callback(stopping, max_t=max_t, refill=refill, storage=store))
        callbacks.extend(after)
        if refill is not None:  # the group ends when its last trial does, not at max_epochs
            overrides["max_epochs"] = max_t * planned
    trainer = trainer_factory(root_dir=root, callbacks=callbacks, **overrides)
    checkpoint = trainer_factory.last_checkpoint(root)
    if checkpoint is not None:
        log.info("trials %s: resuming from %s", trial_ids, checkpoint)
    trainer.fit(fused, datamodule=datamodule, ckpt_path=checkpoint)
    results = {
        tid: TrialResult(
            status=r["status"],
            budget=r["budget"],
            budget_unit=r.get("budget_unit", "epochs"),
            metrics=r["metrics"],
            history=r["history"],
            backend=r.get("backend", ""),
        )
        for tid, r in fused.results.items()
    }
    results.update(builder.failed)
    if not trainer.is_global_zero:  # a further DDP rank: the same results, written by rank zero
        return results
    if backend_cache is not None and use_cache and settings.backend == "auto":
        backend_cache.record(signature, (r.get("backend", "") for r in results.values()))
    if all(r["status"] != "running" for r in results.values()):
        write_json_atomic(root / ROUND_RESULT_FILE, {str(k): v for k, v in results.items()})
    return results


def _fit_one(
    build_module: Callable[[int], L.LightningModule],
    trial_id: int,
    datamodule: L.LightningDataModule,
    trainer_factory: TrainerFactory,
    workdir: Path,
) -> TrialResult:
    root = trial_dir(workdir, trial_id)
    done: TrialResult | None = read_json_or_redo(root / TRIAL_RESULT_FILE, _REDO)
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
        budget_unit="epochs",
        metrics=metrics,
        history=history.of(trial_id),
        backend="",
    )
    if result["status"] != "running":
        write_json_atomic(root / TRIAL_RESULT_FILE, result)
    return result


def _status(trainer: L.Trainer, guard: _DivergenceGuard) -> TrialStatus:
    if trainer.interrupted:
        return "running"
    if guard.diverged:
        return "diverged"
    max_epochs = trainer.max_epochs if trainer.max_epochs is not None and trainer.max_epochs >= 0 else math.inf
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
