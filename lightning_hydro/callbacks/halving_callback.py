"""``HalvingCallback``: what every early-stopping callback shares, whatever its rung rule.

A callback judges trials when they have trained a budget (epochs or steps, counted from when each trial
entered its slot) and a fresh value of ``monitor`` is logged: at the end of each validation, or at the end of
each training epoch when the Trainer runs no validation. The rule itself (which trials stop) lives in
:mod:`lightning_hydro.schedulers`; subclasses pick it. Two ways to run:

- **A FusedLightningModule** (many trials in one process): the running trials are judged together; losers
  leave their slot through ``stop_trial`` (the group really shrinks) and, with ``refill=``, freed slots take new
  trials at once. Trials that reach ``max_t`` are stopped as ``completed``.
- **An ordinary LightningModule** (one trial per process, e.g. a Hydra multirun): the trial is judged against
  the rung records all processes share through ``storage`` (a SQLite file by default, or a database URL).
  When it is stopped, ``trainer.fit`` ends normally (``trainer.should_stop``) and :attr:`status` and
  :attr:`result` say how it ended.

Decisions are made on global rank zero and broadcast to the other ranks; everything needed to resume is in
:meth:`state_dict`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_hydro.callbacks.callback_arguments import (
    check_arguments,
    default_trial_id,
    open_storage,
)
from lightning_hydro.callbacks.refill_source import RefillSource, RefillSpec
from lightning_hydro.callbacks.trial_outcome import OutcomeStatus, TrialOutcome, format_summary
from lightning_hydro.fused import FusedLightningModule
from lightning_hydro.schedulers import (
    BudgetSummary,
    Decision,
    HalvingConfig,
    Mode,
    RungStore,
    StoreSpec,
    TrialId,
    TrialReport,
    summarize_budget,
)

__all__ = ["DEFAULT_STORE_FILE", "HalvingCallback", "TimeAttr"]

TimeAttr = Literal["epochs", "steps"]
"""What a budget counts: training epochs, or optimizer steps."""

DEFAULT_STORE_FILE = "lightning_hydro_rungs.db"
"""The SQLite file, in the Trainer's ``default_root_dir``, that one-trial-per-process runs share by default."""

T = TypeVar("T")


@dataclass(frozen=True)
class _Report:
    trial_id: TrialId  # the fused trial id, or this process's trial id
    key: TrialId  # the id under which the rule (and its store) knows the trial
    budget: int
    value: float


class HalvingCallback(Callback):
    """Base class of :class:`SuccessiveHalving`, :class:`ASHA`, :class:`Hyperband` and :class:`Deadline`.

    Args:
        monitor: The metric that ranks trials, as the trial modules log it (e.g. ``"val_loss"``; a fused
            module logs it per trial as ``"val_loss/trial_{id}"``: pass the plain name).
        mode: ``"min"`` if a lower ``monitor`` is better (a loss), ``"max"`` if a higher one is (an accuracy).
        grace_period: Budget every trial gets before it is first judged (the first rung).
        reduction_factor: ``eta``: rungs are at ``grace_period * eta**k``; each keeps about ``1/eta`` of trials.
        max_t: Budget at which a trial is complete. Default: the Trainer's ``max_epochs`` (or ``max_steps``).
        time_attr: Count budgets in ``"epochs"`` or optimizer ``"steps"``.
        refill: New trials for freed slots of a fused module (see
            :class:`~lightning_hydro.callbacks.refill_source.RefillSource`): an iterable of modules or a factory.
        storage: Where rung records live: None (in memory for a fused module; for an ordinary module the SQLite
            file ``lightning_hydro_rungs.db`` in the Trainer's ``default_root_dir``), a SQLite path or
            ``"sqlite:///..."`` URL, a database server URL, or a ``RungStore``.
        namespace: The sweep's name inside the storage; sweeps sharing a file need different names.
        trial_id: One trial per process: this process's trial id in the storage (default: ``"job{n}"`` under a
            Hydra multirun, else a random id). A fused module in shared storage: a prefix for its trials' ids.
        verbose: Log every decision (the summary at the end of fit is always logged).

    Attributes:
        config: The rule's settings, once ``fit`` has started (``max_t`` resolved).
        outcomes: ``{trial_id: TrialOutcome}`` for every trial this callback stopped or completed.
        budget: Budget spent against training every trial to ``max_t`` (at the end of fit).
        summary: The summary logged at the end of fit.
        status: One trial per process: ``"running"``, ``"completed"``, ``"stopped"`` or ``"diverged"``.
        result: One trial per process, at the end of fit: ``{"trial_id", "status", "budget", "epochs",
            "steps", "metrics", "reason", "rung"}``.
    """

    def __init__(
        self,
        monitor: str,
        mode: Mode = "min",
        *,
        grace_period: int = 1,
        reduction_factor: int = 3,
        max_t: int | None = None,
        time_attr: TimeAttr = "epochs",
        refill: RefillSpec | None = None,
        storage: StoreSpec = None,
        namespace: str = "default",
        trial_id: TrialId | None = None,
        verbose: bool = False,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        check_arguments(name, monitor, mode, grace_period, reduction_factor, max_t, time_attr, namespace, trial_id)
        self.monitor = monitor
        self.mode: Mode = mode
        self.grace_period = grace_period
        self.reduction_factor = reduction_factor
        self.max_t = max_t
        self.time_attr: TimeAttr = time_attr
        self.namespace = namespace
        self.trial_id = trial_id
        self.verbose = verbose
        self.storage = storage
        # Opened now, so that a path or URL that cannot be opened fails before any Trainer exists.
        self._store: RungStore | None = None if storage is None else open_storage(name, storage, namespace)
        self._refill = None if refill is None else RefillSource(refill, owner=name)
        self.config: HalvingConfig | None = None
        self.rule: Any = None
        self._fused = False
        self._trial_key: TrialId | None = None  # one trial per process: its id in the rule
        self._prefix: str | None = None  # fused module in shared storage: prefix of its trials' ids
        self._reset_fit_state()
        self._saved_state: Mapping[str, Any] | None = None

    def _reset_fit_state(self) -> None:
        """What one fit records: outcomes, reports, the summary, and the one-trial-per-process counters."""
        self.outcomes: dict[TrialId, TrialOutcome] = {}
        self.budget: BudgetSummary | None = None
        self.summary = ""
        self.status = "running"
        self.result: dict[str, Any] = {}
        self._reported: dict[TrialId, int] = {}  # budget of each trial's last report
        self._started = False
        self._pending = False  # fused module without validation: decide when its epoch values are published
        self._epochs = 0  # epochs trained in this fit (one trial per process: the trial's budget)
        # The index of the last epoch counted in _epochs. An index, not a flag reset at epoch start: a fit
        # resumed from a checkpoint written after an epoch's last batch starts the next epoch without
        # on_train_epoch_start.
        self._counted_epoch = -1
        self._monitor_seen = False
        self._sanity_checked = False  # the sanity check logged names (a fused module then knows what it logs)

    # -- what subclasses provide -------------------------------------------------------------------------------

    def _build_rule(self, config: HalvingConfig, store: RungStore | None) -> Any:
        """The rule object (from :mod:`lightning_hydro.schedulers`); it must have ``state_dict``/``load_state_dict``."""
        raise NotImplementedError

    def _judge(self, reports: list[TrialReport], *, together: bool) -> list[Decision]:
        """Decisions for ``reports`` (in order); ``together``: the reports of a fused group at one point."""
        if together:
            return self.rule.report_batch(reports)
        return [self.rule.report(*report) for report in reports]

    def _on_trial_started(self, key: TrialId) -> None:
        """A trial entered the run (e.g. Hyperband deals it to a bracket)."""

    def _bracket_of(self, key: TrialId) -> int | None:
        """The trial's Hyperband bracket, if the rule has brackets."""
        return None

    def _extra_stops(
        self, trainer: L.Trainer, pl_module: L.LightningModule, reports: list[_Report], stopping: set[TrialId]
    ) -> list[TrialOutcome]:
        """More trials to stop after the rule's decisions (rank zero only; the deadline policy uses this)."""
        return []

    def _end_reason(self, budget: int) -> str:
        """Why a trial still running when training ends, short of ``max_t``, stopped."""
        assert self.config is not None
        return f"fit ended at {budget} of max_t={self.config.max_t} {self.time_attr}"

    def _admissions(self, trainer: L.Trainer, pl_module: FusedLightningModule, free_slots: int) -> int:
        """How many new trials may fill free slots now (rank zero only)."""
        return free_slots

    def _settings(self) -> dict[str, Any]:
        """The settings a checkpoint must have been made with to be resumed by this callback."""
        return {
            "monitor": self.monitor,
            "mode": self.mode,
            "grace_period": self.grace_period,
            "reduction_factor": self.reduction_factor,
            "max_t": None if self.config is None else self.config.max_t,
            "time_attr": self.time_attr,
        }

    # -- Lightning hooks -----------------------------------------------------------------------------------------

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(monitor=self.monitor, mode=self.mode)

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != TrainerFn.FITTING.value:
            return
        self._fused = isinstance(pl_module, FusedLightningModule)
        self._check_module(pl_module)
        self.config = HalvingConfig(self.mode, self.grace_period, self.reduction_factor, self._resolve_max_t(trainer))
        store = self._store
        if store is None and not self._fused:
            path = os.path.join(trainer.default_root_dir, DEFAULT_STORE_FILE)
            store = open_storage(type(self).__name__, path, self.namespace)
        self.rule = self._build_rule(self.config, store)
        self._reset_fit_state()
        if self._fused:
            shared = store is not None
            self._prefix = (
                None if not shared else str(self.trial_id if self.trial_id is not None else default_trial_id())
            )
            assert isinstance(pl_module, FusedLightningModule)
            for tid in pl_module.trial_ids:
                self._on_trial_started(self._key(tid))
        else:
            self._trial_key = self.trial_id if self.trial_id is not None else default_trial_id()
            self._on_trial_started(self._trial_key)
        if self._saved_state is not None:
            self._restore(self._saved_state)
            self._saved_state = None

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        assert self.config is not None
        if self.time_attr == "steps":
            limit = trainer.estimated_stepping_batches
            if limit != float("inf") and self.config.max_t > limit:
                raise ValueError(
                    f"{type(self).__name__}: max_t={self.config.max_t} steps is beyond the {int(limit)} optimizer "
                    "steps this Trainer will take (max_steps, or max_epochs times the batches per epoch), so no "
                    f"trial could reach max_t. Lower max_t to at most {int(limit)}, or train longer."
                )
        if not self._fused and self.status != "running":
            trainer.should_stop = True  # resumed after this trial had already ended
        if not self._started:
            self._started = True
            self._refill_slots(trainer, pl_module)

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._pending:
            self._pending = False
            self._decide(trainer, pl_module)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not self._monitor_seen and isinstance(pl_module, FusedLightningModule):
            self._check_monitor_early(trainer, pl_module)
        if batch_idx + 1 >= trainer.num_training_batches:
            self._count_epoch(trainer)  # before validation, as a fused module counts its trials' epochs

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._count_epoch(trainer)
        if not trainer.enable_validation:
            if self._fused:
                # A fused module publishes its trials' epoch values in its own on_train_epoch_end, which runs
                # after this hook: decide when the next epoch starts (or when training ends).
                self._pending = True
            else:
                self._decide(trainer, pl_module)

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking and isinstance(pl_module, FusedLightningModule):
            # a module that logs nothing in the sanity check may skip logging there on purpose: no verdict
            self._sanity_checked = bool(pl_module.logged_names)
            self._monitor_seen = self._monitor_seen or self.monitor in pl_module.logged_names
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        self._decide(trainer, pl_module)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._pending:
            self._pending = False
            self._decide(trainer, pl_module)
        self._finish(trainer, pl_module)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "settings": self._settings(),
            "rule": None if self.rule is None else self.rule.state_dict(),
            "outcomes": [outcome.as_dict() for outcome in self.outcomes.values()],
            "reported": [[tid, budget] for tid, budget in self._reported.items()],
            "refill": None if self._refill is None else self._refill.state_dict(),
            "started": self._started,
            "pending": self._pending,
            "monitor_seen": self._monitor_seen,
            "trial_key": self._trial_key,
            "prefix": self._prefix,
            "epochs": self._epochs,
            "counted_epoch": self._counted_epoch,
            "status": self.status,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.rule is None:  # not set up yet: restored in setup, once the rule exists
            self._saved_state = state_dict
            return
        self._restore(state_dict)

    # -- decisions ----------------------------------------------------------------------------------------------

    def _decide(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        reports = self._collect_reports(trainer, pl_module)
        outcomes = self._on_rank_zero(trainer, lambda: self._judge_reports(trainer, pl_module, reports))
        for report in reports:
            self._reported[report.trial_id] = report.budget
        stopping = trainer.should_stop
        self._apply(trainer, pl_module, outcomes)
        if self._refill_slots(trainer, pl_module) and not stopping:
            # the fused module asked the Trainer to stop when its last trial left; new trials took the slots
            trainer.should_stop = False

    def _judge_reports(
        self, trainer: L.Trainer, pl_module: L.LightningModule, reports: list[_Report]
    ) -> list[TrialOutcome]:
        by_key = {report.key: report for report in reports}
        decisions = (
            self._judge([TrialReport(r.key, r.budget, r.value) for r in reports], together=self._fused)
            if reports
            else []
        )
        outcomes = [self._outcome(by_key[d.trial_id].trial_id, d) for d in decisions if d.action != "continue"]
        outcomes += self._extra_stops(trainer, pl_module, reports, {outcome.trial_id for outcome in outcomes})
        return outcomes

    def _collect_reports(self, trainer: L.Trainer, pl_module: L.LightningModule) -> list[_Report]:
        """Each running trial whose budget grew since its last report, with its monitored value."""
        if self._fused:
            assert isinstance(pl_module, FusedLightningModule)
            results = pl_module.results
            running = pl_module.trial_ids
            values = {tid: results[tid]["metrics"].get(self.monitor) for tid in running}
            if running and all(value is None for value in values.values()) and not self._monitor_seen:
                logged = sorted({name for tid in running for name in results[tid]["metrics"]})
                raise self._monitor_error(trainer, logged, per_trial=True)
            reports = []
            for tid in running:
                budget = self._record_budget(results[tid])
                value = values[tid]
                if value is not None and budget > self._reported.get(tid, 0):
                    reports.append(_Report(tid, self._key(tid), budget, float(value)))
        else:
            metrics = trainer.callback_metrics
            if self.monitor not in metrics:
                raise self._monitor_error(trainer, sorted(metrics), per_trial=False)
            assert self._trial_key is not None
            budget = self._trial_budget(trainer, pl_module, self._trial_key)
            reports = []
            if budget > self._reported.get(self._trial_key, 0):
                value = float(metrics[self.monitor])
                reports = [_Report(self._trial_key, self._trial_key, budget, value)]
        self._monitor_seen = self._monitor_seen or bool(reports)
        return reports

    def _check_monitor_early(self, trainer: L.Trainer, pl_module: FusedLightningModule) -> None:
        """Raise now if the trials cannot log ``monitor``, not at the first rung, after every trial trained.

        A fused module knows every name its trials log once its training step and (in the sanity check) its
        validation step have run; without a sanity check, the validation step's names come at the first rung.
        """
        logged = pl_module.logged_names
        if self.monitor in logged:
            self._monitor_seen = True
        elif self._sanity_checked or not trainer.enable_validation:
            raise self._monitor_error(
                trainer, sorted(logged), per_trial=True, when="the sanity check and the first training batch"
            )

    def _monitor_error(
        self, trainer: L.Trainer, logged: list[str], *, per_trial: bool, when: str | None = None
    ) -> RuntimeError:
        where = "by any trial of the fused module" if per_trial else "in trainer.callback_metrics"
        shown = ", ".join(repr(name) for name in logged) if logged else "nothing"
        first = "validation" if trainer.enable_validation else "training epoch"
        when_text = f"after {when}" if when else f"at the end of the first {first}"
        hint = (
            " Pass the name the trial modules give self.log, without the '/trial_{id}' suffix."
            if per_trial
            else " Pass one of these, or log the metric in validation_step (or training_step without validation)."
        )
        return RuntimeError(
            f"{type(self).__name__}(monitor={self.monitor!r}): the monitor is not logged {where} "
            f"{when_text}; logged: {shown}.{hint}"
        )

    def _outcome(self, trial_id: TrialId, decision: Decision) -> TrialOutcome:
        status: OutcomeStatus
        bracket = self._bracket_of(decision.trial_id)
        assert self.config is not None
        if decision.action == "complete":
            status, reason = "completed", f"reached max_t={self.config.max_t}"
        elif decision.reason == "diverged":
            status, reason = "diverged", f"{self.monitor} is {decision.value} (diverged)"
        else:
            status = "stopped"
            where = f"{type(self).__name__}" + (f" bracket {bracket}" if bracket is not None else "")
            reason = (
                f"{where} rung {decision.rung} (budget {decision.budget}): {self.monitor} {decision.value:.6g} "
                f"worse than cutoff {decision.cutoff:.6g}"
            )
        return TrialOutcome(trial_id, status, decision.budget, reason, decision.rung, bracket, decision.value)

    def _apply(self, trainer: L.Trainer, pl_module: L.LightningModule, outcomes: list[TrialOutcome]) -> None:
        for outcome in outcomes:
            self.outcomes[outcome.trial_id] = outcome
            if self._fused:
                assert isinstance(pl_module, FusedLightningModule)
                if outcome.trial_id in pl_module.trial_ids:
                    pl_module.stop_trial(int(outcome.trial_id), outcome.reason, status=outcome.status)
            else:
                self.status = outcome.status
                trainer.should_stop = True
            if self.verbose:
                rank_zero_info(
                    f"{type(self).__name__}: trial {outcome.trial_id} {outcome.status} at budget {outcome.budget}: "
                    f"{outcome.reason}."
                )

    def _refill_slots(self, trainer: L.Trainer, pl_module: L.LightningModule) -> int:
        """Fill free slots with new trials, as many as :meth:`_admissions` allows; returns how many were added."""
        if not self._fused or self._refill is None or self._refill.exhausted:
            return 0
        assert isinstance(pl_module, FusedLightningModule)
        if not pl_module.free_slots:
            return 0
        admitted = self._on_rank_zero(trainer, lambda: self._admissions(trainer, pl_module, pl_module.free_slots))
        added = 0
        for _ in range(admitted):
            drawn = self._refill.draw()
            if drawn is None:
                break
            trial_id, module = drawn if isinstance(drawn, tuple) else (None, drawn)
            added += 1
            if trainer.world_size > 1:  # every rank must hold the same new trial
                module.load_state_dict(trainer.strategy.broadcast(module.state_dict(), src=0))
            tid = pl_module.add_trial(module, trial_id)  # in eval mode if added during validation, training after it
            self._on_trial_started(self._key(tid))
            if self.verbose:
                rank_zero_info(f"{type(self).__name__}: trial {tid} fills a free slot.")
        return added

    def _finish(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """End the trials still running (completed at max_t, else stopped), then log the summary."""
        assert self.config is not None
        max_t = self.config.max_t
        unit = self.time_attr
        if self._fused:
            assert isinstance(pl_module, FusedLightningModule)
            running = pl_module.results
            ended = [self._end_outcome(tid, self._record_budget(running[tid])) for tid in pl_module.trial_ids]
            self._apply(trainer, pl_module, ended)
            results = pl_module.results
            budgets: dict[TrialId, int] = {tid: self._record_budget(r) for tid, r in results.items()}
            statuses: dict[TrialId, str] = {tid: str(r["status"]) for tid, r in results.items()}
        else:
            assert self._trial_key is not None
            budget = self._trial_budget(trainer, pl_module, self._trial_key)
            if self.status == "running":
                self.outcomes[self._trial_key] = self._end_outcome(self._trial_key, budget)
                self.status = self.outcomes[self._trial_key].status
            outcome = self.outcomes[self._trial_key]
            budgets, statuses = {self._trial_key: budget}, {self._trial_key: str(self.status)}
            self.result = {
                "trial_id": self._trial_key,
                "status": self.status,
                "budget": budget,
                "epochs": self._epochs,
                "steps": trainer.global_step,
                "metrics": {name: float(value) for name, value in trainer.callback_metrics.items()},
                "reason": outcome.reason,
                "rung": outcome.rung,
            }
        self.budget = summarize_budget(budgets, max_t)
        self.summary = format_summary(
            type(self).__name__, self.outcomes, budgets, max_t=max_t, time_attr=unit, statuses=statuses
        )
        if not self._fused:
            self.summary += f"\nTrial {self._trial_key}: {self.status} at budget {budget}: {outcome.reason}."
        rank_zero_info(self.summary)

    # -- helpers -----------------------------------------------------------------------------------------------

    def _trial_budget(self, trainer: L.Trainer, pl_module: L.LightningModule, trial_id: TrialId) -> int:
        if self._fused:
            assert isinstance(pl_module, FusedLightningModule)
            return self._record_budget(pl_module.results[int(trial_id)])
        return self._epochs if self.time_attr == "epochs" else int(trainer.global_step)

    def _record_budget(self, record: Mapping[str, Any]) -> int:
        """A fused trial's budget from its ``results`` record (read ``results`` once per loop: it is a copy)."""
        return int(record["epochs"] if self.time_attr == "epochs" else record["steps"])

    def _end_outcome(self, trial_id: TrialId, budget: int) -> TrialOutcome:
        """How a trial still running when training ends ends: completed at ``max_t``, else stopped."""
        assert self.config is not None
        max_t = self.config.max_t
        if budget >= max_t:
            return TrialOutcome(trial_id, "completed", budget, f"reached max_t={max_t}")
        return TrialOutcome(trial_id, "stopped", budget, self._end_reason(budget))

    def _count_epoch(self, trainer: L.Trainer) -> None:
        if self._counted_epoch != trainer.current_epoch:
            self._epochs += 1
            self._counted_epoch = trainer.current_epoch

    def _key(self, trial_id: TrialId) -> TrialId:
        return trial_id if self._prefix is None else f"{self._prefix}/{trial_id}"

    def _on_rank_zero(self, trainer: L.Trainer, compute: Callable[[], T]) -> T:
        """``compute()`` on global rank zero, its result broadcast to every rank."""
        value = compute() if trainer.is_global_zero else None
        return trainer.strategy.broadcast(value, src=0)  # type: ignore[return-value]

    def _check_module(self, pl_module: L.LightningModule) -> None:
        name = type(self).__name__
        if self._refill is not None and not self._fused:
            raise ValueError(
                f"{name}: refill= needs a FusedLightningModule (it refills the slots that stopped trials free), got "
                f"a {type(pl_module).__name__}. With one trial per process, the sweep (e.g. a Hydra multirun) "
                "starts the next trial; drop refill=."
            )

    def _resolve_max_t(self, trainer: L.Trainer) -> int:
        name = type(self).__name__
        if self.time_attr == "epochs":
            limit, limit_name = trainer.max_epochs, "max_epochs"
        else:
            limit, limit_name = trainer.max_steps, "max_steps"
        bounded = limit is not None and limit >= 0
        if self.max_t is None:
            if not bounded:
                raise ValueError(
                    f"{name}: max_t is not set and the Trainer has no {limit_name} limit, so no budget would mark a "
                    f"trial complete. Pass max_t=..., e.g. {name}(..., max_t=27)."
                )
            assert limit is not None
            if limit < self.grace_period:
                raise ValueError(
                    f"{name}: max_t defaults to the Trainer's {limit_name}={limit}, which is below "
                    f"grace_period={self.grace_period}: no trial would ever be judged. Lower grace_period or "
                    f"raise {limit_name}."
                )
            return int(limit)
        if bounded and limit is not None and self.max_t > limit:
            raise ValueError(
                f"{name}: max_t={self.max_t} {self.time_attr} is beyond the Trainer's {limit_name}={limit}, so no "
                f"trial could reach max_t. Lower max_t to at most {limit}, or raise the Trainer's {limit_name}."
            )
        return self.max_t

    def _restore(self, state: Mapping[str, Any]) -> None:
        mine, theirs = self._settings(), dict(state["settings"])
        if mine != theirs:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: the checkpoint was made with {theirs}, but this callback "
                f"has {mine}. Resume with the settings the run started with."
            )
        if state["rule"] is not None:
            self.rule.load_state_dict(state["rule"])
        self.outcomes = {o["trial_id"]: TrialOutcome.from_dict(o) for o in state["outcomes"]}
        self._reported = {tid: int(budget) for tid, budget in state["reported"]}
        if self._refill is not None and state["refill"] is not None:
            self._refill.load_state_dict(state["refill"])
        self._started = bool(state["started"])
        self._pending = bool(state["pending"])
        self._monitor_seen = bool(state["monitor_seen"])
        self._trial_key = state["trial_key"]
        self._prefix = state["prefix"]
        self._epochs = int(state["epochs"])
        self._counted_epoch = int(state["counted_epoch"])
        self.status = str(state["status"])
