"""``HalvingCallback``: what every early-stopping callback shares, whatever its rung rule.

A callback judges trials when they have trained a budget (epochs or steps, counted from when each trial
entered its slot) and a fresh value of ``monitor`` is logged: at the end of each validation, or at the end of
each training epoch when the Trainer runs no validation. The rule (which trials stop) lives in
:mod:`lightning_hydro.stopping`; subclasses pick it. What the callback sees of its trials, a fused group or
the one trial of this process, is a :class:`~lightning_hydro.callbacks.trials_view.TrialsView`. Decisions are
made on global rank zero and broadcast to the other ranks; everything needed to resume is in :meth:`state_dict`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from lightning_hydro._deprecation import RenamedAttribute
from lightning_hydro.callbacks.callback_arguments import check_arguments, check_steps_limit, open_storage, resolve_max_t
from lightning_hydro.callbacks.refill_source import RefillSource, RefillSpec
from lightning_hydro.callbacks.trial_ending import TrialEnding, format_summary
from lightning_hydro.callbacks.trials_view import DEFAULT_STORE_FILE, TrialsView, open_trials_view
from lightning_hydro.stopping import (
    BudgetSummary,
    Decision,
    HalvingConfig,
    Mode,
    RungStore,
    StoreSpec,
    TimeAttr,
    TrialId,
    TrialReport,
    TrialStatus,
    summarize_budget,
)

__all__ = ["DEFAULT_STORE_FILE", "HalvingCallback", "TimeAttr"]

T = TypeVar("T")


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
        endings: ``{trial_id: TrialEnding}`` for every trial this callback stopped or completed.
        budget: Budget spent against training every trial to ``max_t`` (at the end of fit).
        summary: The summary logged at the end of fit.
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
        self._view: TrialsView | None = None
        self._saved_state: Mapping[str, Any] | None = None
        self._reset_fit_state()

    def _reset_fit_state(self) -> None:
        """What one fit records: endings, reports and the summary."""
        self.endings: dict[TrialId, TrialEnding] = {}
        self.budget: BudgetSummary | None = None
        self.summary = ""
        self.result: dict[str, Any] = {}
        self._reported: dict[TrialId, int] = {}  # budget of each trial's last report
        self._started = False

    @property
    def status(self) -> TrialStatus:
        """One trial per process: ``"running"``, ``"completed"``, ``"stopped"`` or ``"diverged"``."""
        return "running" if self._view is None else self._view.status

    outcomes = RenamedAttribute("endings", "is renamed endings (a TrialEnding per trial it ended); use .endings")

    # -- what subclasses provide -------------------------------------------------------------------------------

    def _build_rule(self, config: HalvingConfig, store: RungStore | None) -> Any:
        """The rule object (from :mod:`lightning_hydro.stopping`); it must have ``state_dict``/``load_state_dict``."""
        raise NotImplementedError

    def _judge(self, reports: list[TrialReport], *, together: bool) -> list[Decision]:
        """Decisions for ``reports`` (in order); ``together``: the reports of a fused group at one point."""
        if together:
            return list(self.rule.report_batch(reports))
        return [self.rule.report(*report) for report in reports]

    def _check_trials(self, view: TrialsView, pl_module: L.LightningModule) -> None:
        """Raise if this callback cannot judge the trials of ``pl_module`` (called when fit starts)."""
        if self._refill is not None and not view.takes_new_trials:
            raise ValueError(
                f"{type(self).__name__}: refill= needs a FusedLightningModule (it refills the slots that stopped "
                f"trials free), got a {type(pl_module).__name__}. With one trial per process, the sweep (e.g. a Hydra "
                "multirun) starts the next trial; drop refill=."
            )

    def _on_trial_started(self, key: TrialId) -> None:
        """A trial entered the run (e.g. Hyperband deals it to a bracket)."""

    def _bracket_of(self, key: TrialId) -> int | None:
        """The trial's Hyperband bracket, if the rule has brackets."""
        return None

    def _extra_stops(self, values: Mapping[TrialId, float | None], stopping: set[TrialId]) -> list[TrialEnding]:
        """More trials to stop after the rule's decisions (rank zero only; the deadline policy uses this)."""
        return []

    def _end_reason(self, budget: int) -> str:
        """Why a trial still running when training ends, short of ``max_t``, stopped."""
        return f"fit ended at {budget} of max_t={self._config.max_t} {self.time_attr}"

    def _admissions(self, free_slots: int) -> int:
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
        name = type(self).__name__
        view, store = open_trials_view(
            trainer,
            pl_module,
            monitor=self.monitor,
            owner=name,
            time_attr=self.time_attr,
            trial_id=self.trial_id,
            store=self._store,
            namespace=self.namespace,
        )
        self._check_trials(view, pl_module)
        max_t = resolve_max_t(name, self.max_t, self.grace_period, self.time_attr, trainer)
        self.config = HalvingConfig(self.mode, self.grace_period, self.reduction_factor, max_t)
        self._view = view
        self.rule = self._build_rule(self.config, store)
        self._reset_fit_state()
        for tid in view.running():
            self._on_trial_started(view.rule_key(tid))
        if self._saved_state is not None:
            self._restore(self._saved_state)
            self._saved_state = None

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.time_attr == "steps":
            check_steps_limit(type(self).__name__, self._config.max_t, trainer)
        self._trials.train_started()
        if not self._started:
            self._started = True
            self._refill_slots(trainer)

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._trials.batch_ended(batch_idx)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._trials.epoch_ended()
        if not trainer.enable_validation:
            self._decide(trainer, pl_module, epoch_end=True)

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            self._trials.sanity_check_ended()
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        self._decide(trainer, pl_module, epoch_end=False)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._finish()

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "settings": self._settings(),
            "rule": None if self.rule is None else self.rule.state_dict(),
            "endings": [ending.as_dict() for ending in self.endings.values()],
            "reported": [[tid, budget] for tid, budget in self._reported.items()],
            "refill": None if self._refill is None else self._refill.state_dict(),
            "started": self._started,
            "view": None if self._view is None else self._view.state_dict(),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.rule is None:  # not set up yet: restored in setup, once the rule exists
            self._saved_state = state_dict
            return
        self._restore(state_dict)

    # -- decisions ----------------------------------------------------------------------------------------------

    def _decide(self, trainer: L.Trainer, pl_module: L.LightningModule, *, epoch_end: bool) -> None:
        """Judge every running trial whose budget grew since its last report, stop the losers, refill slots."""
        view = self._trials
        values = view.values(epoch_end=epoch_end)
        reports = [
            TrialReport(tid, budget, float(value))
            for tid, value in values.items()
            if value is not None and (budget := view.budget(tid)) > self._reported.get(tid, 0)
        ]
        endings = self._on_rank_zero(trainer, lambda: self._judge_reports(reports, values))
        for report in reports:
            self._reported[report.trial_id] = report.budget
        self._apply(endings)
        self._refill_slots(trainer)  # a fused group ends its fit itself if no trial runs after this hook

    def _judge_reports(self, reports: list[TrialReport], values: Mapping[TrialId, float | None]) -> list[TrialEnding]:
        view, name, max_t = self._trials, type(self).__name__, self._config.max_t
        by_key = {view.rule_key(report.trial_id): report.trial_id for report in reports}
        keyed = [report._replace(trial_id=view.rule_key(report.trial_id)) for report in reports]
        decisions = [d for d in (self._judge(keyed, together=view.together) if keyed else []) if d.action != "continue"]
        endings = [
            TrialEnding.from_decision(by_key[d.trial_id], d, name, self.monitor, max_t, self._bracket_of(d.trial_id))
            for d in decisions
        ]
        return endings + self._extra_stops(values, {ending.trial_id for ending in endings})

    def _apply(self, endings: list[TrialEnding]) -> None:
        for ending in endings:
            self.endings[ending.trial_id] = ending
            self._trials.stop(ending)
            if self.verbose:
                rank_zero_info(
                    f"{type(self).__name__}: trial {ending.trial_id} {ending.status} at budget {ending.budget}: "
                    f"{ending.reason}."
                )

    def _refill_slots(self, trainer: L.Trainer) -> None:
        """Fill free slots with new trials, as many as :meth:`_admissions` allows.

        Rank zero draws them (a sampler behind the refill source is asked once) and every rank adds the same
        modules: under DDP they are sent to the other ranks.
        """
        view = self._trials
        if self._refill is None or not view.free_slots():
            return
        for trial_id, module in self._on_rank_zero(trainer, lambda: self._draw(view.free_slots())):
            tid = view.add(module, trial_id)
            self._on_trial_started(view.rule_key(tid))
            if self.verbose:
                rank_zero_info(f"{type(self).__name__}: trial {tid} fills a free slot.")

    def _draw(self, free_slots: int) -> list[tuple[int | None, L.LightningModule]]:
        """New trials for ``free_slots`` free slots, as many as :meth:`_admissions` allows (rank zero only)."""
        drawn: list[tuple[int | None, L.LightningModule]] = []
        if self._refill is None or self._refill.exhausted:
            return drawn
        for _ in range(self._admissions(free_slots)):
            one = self._refill.draw()
            if one is None:
                break
            drawn.append(one if isinstance(one, tuple) else (None, one))
        return drawn

    def _finish(self) -> None:
        """End the trials still running (completed at max_t, else stopped), then log the summary."""
        view, max_t = self._trials, self._config.max_t
        running = {tid: view.budget(tid) for tid in view.running()}
        self._apply([TrialEnding.at_end_of_fit(t, b, max_t, self._end_reason(b)) for t, b in running.items()])
        budgets, statuses = view.ended()
        self.budget = summarize_budget(budgets, max_t)
        self.summary = format_summary(
            type(self).__name__, self.endings, budgets, max_t=max_t, time_attr=self.time_attr, statuses=statuses
        )
        self.result = view.final_result(self.endings)
        if self.result:  # one trial per process
            trial = self.result
            self.summary += (
                f"\nTrial {trial['trial_id']}: {trial['status']} at budget {trial['budget']}: {trial['reason']}."
            )
        rank_zero_info(self.summary)

    # -- helpers -----------------------------------------------------------------------------------------------

    @property
    def _trials(self) -> TrialsView:
        if self._view is None:
            raise RuntimeError(f"{type(self).__name__}: used before Trainer.fit set it up.")
        return self._view

    @property
    def _config(self) -> HalvingConfig:
        if self.config is None:
            raise RuntimeError(f"{type(self).__name__}: used before Trainer.fit set it up.")
        return self.config

    def _on_rank_zero(self, trainer: L.Trainer, compute: Callable[[], T]) -> T:
        """``compute()`` on global rank zero, its result broadcast to every rank.

        If it raises on rank zero, every rank raises (the others name rank zero's error), instead of the others
        waiting for a decision that never comes.
        """
        value: T | None = None
        failure: BaseException | None = None
        if trainer.is_global_zero:
            try:
                value = compute()
            except Exception as err:  # re-raised below, once every rank knows
                failure = err
        failed = None if failure is None else f"{type(failure).__name__}: {failure}"
        value, failed = trainer.strategy.broadcast((value, failed), src=0)
        if failure is not None:
            raise failure
        if failed is not None:
            name = type(self).__name__
            raise RuntimeError(f"{name}: the decision on rank 0 failed ({failed}); see rank 0's traceback.")
        return value  # type: ignore[return-value]

    def _restore(self, state: Mapping[str, Any]) -> None:
        mine, theirs = self._settings(), dict(state["settings"])
        if mine != theirs:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: the checkpoint was made with {theirs}, but this callback "
                f"has {mine}. Resume with the settings the run started with."
            )
        if state["rule"] is not None:
            self.rule.load_state_dict(state["rule"])
        endings = state["endings"] if "endings" in state else state["outcomes"]  # "outcomes": before 0.2
        self.endings = {e["trial_id"]: TrialEnding.from_dict(e) for e in endings}
        self._reported = {tid: int(budget) for tid, budget in state["reported"]}
        if self._refill is not None and state["refill"] is not None:
            self._refill.load_state_dict(state["refill"])
        self._started = bool(state["started"])
        if state["view"] is not None:
            self._trials.load_state_dict(state["view"])
