"""``FusedLightningModule``: B unmodified LightningModules of one architecture trained as one model.

Example::

    >>> import lightning as L
    >>> from lightning_hydro import FusedLightningModule
    >>> from lightning_hydro.demos import DigitsDataModule, DigitsMLP
    >>> trials = [DigitsMLP(hidden_dim=16, lr=lr) for lr in (0.01, 0.1, 0.5)]
    >>> fused = FusedLightningModule(trials, backend="vmap", summary=False)
    >>> trainer = L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False,
    ...                     enable_checkpointing=False, enable_model_summary=False)
    >>> trainer.fit(fused, datamodule=DigitsDataModule())
    >>> fused.trial_ids, sorted(fused.results[0])
    ([0, 1, 2], ['backend', 'budget', 'budget_unit', 'epochs', 'history', 'metrics', 'reason', 'status', 'steps'])
    >>> fused.results[2]["status"], fused.results[2]["budget"], fused.results[2]["backend"]
    ('completed', 1, 'vmap')
    >>> best = fused.unfuse(1)  # a standalone DigitsMLP with trial 1's trained weights
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.types import LRSchedulerConfig
from torch import Tensor, nn
from typing_extensions import override

from lightning_hydro.backends import (
    Backend,
    BackendName,
    FusionError,
    LoopBackend,
    StackedLog,
    StepOutputs,
    VmapBackend,
    make_backend,
)
from lightning_hydro.backends.auto import choose_backend
from lightning_hydro.backends.deferred_metrics import deferred_note, preserved_metric_states
from lightning_hydro.backends.trial_logging import capture_logs
from lightning_hydro.fused.arguments import check_deterministic, check_fused_arguments
from lightning_hydro.fused.trainer_view import attach_trainer
from lightning_hydro.fused.trial_book import TrialBook
from lightning_hydro.fused.trial_callbacks import per_trial_callbacks, refuse_module_callbacks
from lightning_hydro.fused.trial_clipping import clip_trial_gradients
from lightning_hydro.fused.trial_metrics import TrialMetrics, resolve_options
from lightning_hydro.fused.trial_specs import module_spec, rebuild_trials
from lightning_hydro.fused.verify import FusionMismatchError, verify_fusion
from lightning_hydro.fused.width_padding import width_optimizer_path
from lightning_hydro.optim.group_optimizer import (
    OptimizerPath,
    StepReport,
    TrialGroupOptimizer,
    TrialScheduler,
)
from lightning_hydro.optim.trial_optimization import TrialOptimization, parse_optimizer_config
from lightning_hydro.schedulers.trial_record import (
    ENDED_STATUSES,
    TimeAttr,
    TrialRecord,
    TrialResult,
    TrialStatus,
    format_results_table,
)
from lightning_hydro.stacking.stacked_state import StackedState

__all__ = ["FusedLightningModule"]

# Hooks of the trial modules that the fused module exposes only if the trials implement them, so that
# Lightning sees the same loops as in an unfused run (e.g. no validation loop without a validation_step).
_OPTIONAL_HOOKS = (
    "validation_step",
    "test_step",
    "train_dataloader",
    "val_dataloader",
    "test_dataloader",
    "predict_dataloader",
)
# Epoch- and fit-level hooks forwarded to every running trial that overrides them (with its logging captured).
_FORWARDED_HOOKS = {
    "on_fit_start": None,
    "on_train_start": None,
    "on_train_epoch_start": "train",
    "on_train_epoch_end": "train",
    "on_validation_epoch_start": "validate",
    "on_validation_epoch_end": "validate",
    "on_test_epoch_start": "test",
    "on_test_epoch_end": "test",
    "on_train_end": None,
    "on_fit_end": None,
}
_CHECKPOINT_KEY = "lightning_hydro"


def _as_float(value: Any) -> float:
    if hasattr(value, "compute") and hasattr(value, "reset"):  # a torchmetrics Metric
        value = value.compute()
    return float(value.detach().float().reshape(()) if isinstance(value, Tensor) else value)


class FusedLightningModule(L.LightningModule):
    """Train B trials of one architecture (different hyperparameters) as one vectorised model.

    Each trial is the user's own, unmodified LightningModule. Their parameters and buffers are stacked
    ``[B, ...]`` (the trial modules stay bound to their rows); one backend call runs every trial's
    ``training_step`` at once; the loss is the SUM of the trials' losses; each trial's own optimizer and LR
    schedulers step it; what a trial logs is logged as ``"{name}/trial_{id}"``. Trials are isolated: a trial
    whose loss or gradients go non-finite is marked diverged, not stepped, and its slot freed.

    Args:
        trials: the trial modules (one architecture: same parameter/buffer names, shapes, dtypes).
        backend: ``"vmap"`` (torch.func), ``"hfta"`` (fused operators), ``"loop"`` (one trial after another,
            always correct) or ``"auto"`` (time each on the first batch, keep the fastest; a group that early
            stopping leaves with one trial runs it on the loop until another trial joins). The backend in
            use is recorded in ``results[id]["backend"]`` and in checkpoints (a resumed run reuses it).
        pad_widths: allow trials that differ in hidden sizes (Linear features, conv channels, a Transformer
            layer's feed-forward width): they are zero-padded to the group's largest shapes, each trial keeping
            its own width (its module, optimizer and ``unfuse`` copy). Checked by a width plan that names any
            module it refuses; each trial's own optimizer steps it (see :mod:`.width_padding`).
        deterministic: with ``backend="auto"``, choose without timing (timings, and so the choice and the
            arithmetic, change with machine load): the first of hfta, vmap, loop that runs the model.
        trial_ids: one integer id per trial (default ``0..B-1``).
        max_slots: how many trials the group may hold at once (default: ``len(trials)``); ``add_trial``
            fills free slots up to this.
        optimizer_path: ``"auto"`` uses one vectorised update when all trials use SGD, Adam or AdamW over
            all their parameters (same numbers, fewer kernels), else each trial's own optimizer;
            ``"universal"`` always steps each trial's own optimizer; ``"fused"`` requires the fast path.
        verify: on the first batch, compare each trial's fused loss with its own module's (vmap/hfta).
        summary: print a per-trial table at the end of ``fit``.
        monitor: metric that orders that table and marks the best trial (e.g. ``"val_acc"``).
        mode: ``"min"`` or ``"max"``: which ``monitor`` value is best.
        trial_factory: builds the module of a trial id (or returns None); used when a checkpoint holds
            trials that joined the group during the run (refills). Otherwise they are rebuilt as
            ``class(**hparams)`` (with their muP width scaling, if any).

    Raises:
        ValueError / TypeError: an empty list, non-LightningModules, a trial that uses manual optimization,
            duplicate ids, an unknown backend, or trials of different architectures (the message names the
            trial and the tensors that differ).
    """

    def __init__(
        self,
        trials: Sequence[L.LightningModule],
        *,
        backend: BackendName = "auto",
        trial_ids: Sequence[int] | None = None,
        max_slots: int | None = None,
        optimizer_path: OptimizerPath = "auto",
        verify: bool = True,
        summary: bool = True,
        monitor: str | None = None,
        mode: Literal["min", "max"] = "min",
        trial_factory: Callable[[int], L.LightningModule | None] | None = None,
        deterministic: bool = False,
        pad_widths: bool = False,
    ) -> None:
        super().__init__()
        trials = list(trials)
        ids = list(range(len(trials))) if trial_ids is None else [int(t) for t in trial_ids]
        check_fused_arguments(trials, ids, backend, max_slots, optimizer_path, mode)
        self.stacked = nn.Module()  # holds the stacked tensors, so that .to(), state_dict() and Lightning see them
        optimizer_path = width_optimizer_path(trials, ids, pad_widths=pad_widths, optimizer_path=optimizer_path)
        self._group = StackedState(self.stacked, trials, ids, pad_widths=pad_widths)
        self._book = TrialBook(ids)
        self._retired: dict[int, L.LightningModule] = {}
        self._backend_name = backend
        self._backend: Backend | None = None if backend == "auto" else make_backend(backend, self._group)
        self.deterministic = check_deterministic(deterministic)
        if self._backend is not None:
            self._book.set_backend(ids, self._backend.name)
        self._parked: Backend | None = None  # auto's choice, set aside while a lone trial runs on the loop
        self._optimizer_path: OptimizerPath = optimizer_path
        self._optimizer: TrialGroupOptimizer | None = None
        self._metrics = TrialMetrics()
        self._loss_problems: dict[int, str] = {}
        self._diverged_on_resume: dict[int, str] = {}
        self._open_batch: int | None = None
        self._verify_enabled = verify
        self._verify_ids: set[int] = set(ids) if verify else set()
        self._eval_fallback: dict[str, Backend] = {}
        self.max_slots = max_slots if max_slots is not None else len(trials)
        self.summary = summary
        self.monitor = monitor
        self.mode = mode
        self.backend_report = ""
        self.trial_factory = trial_factory
        for hook in _OPTIONAL_HOOKS:
            if not is_overridden(hook, trials[0], L.LightningModule):
                self.__dict__[hook] = None  # hidden: Lightning's is_overridden() then reports False

    @classmethod
    def from_configs(
        cls,
        factory: Callable[..., L.LightningModule],
        configs: Sequence[Mapping[str, Any]],
        *,
        width: str | Sequence[str] | None = None,
        ratio: int = 1,
        trial_ids: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> FusedLightningModule:
        """One trial per hyperparameter config, built by ``factory(**config)``; as muP surrogates if ``width``.

        With ``width`` (the width hyperparameter names) and ``ratio`` S, each trial is the width / S
        :class:`~lightning_hydro.scaling.Surrogate` of ``factory(**config)``: tune these, then train
        ``Surrogate(factory, width).build(**best_config, ratio=1)`` at full size. The same recipe rebuilds
        trials on resume.

        Example::

            >>> from lightning_hydro.demos import DigitsMLP
            >>> fused = FusedLightningModule.from_configs(
            ...     DigitsMLP, [{"hidden_dim": 256, "lr": lr} for lr in (0.03, 0.1, 0.3)], width="hidden_dim", ratio=4)
            >>> fused.stacked.get_parameter("head__weight").shape  # 3 trials of width 256 / 4
            torch.Size([3, 10, 64])
        """
        from lightning_hydro.scaling import Surrogate

        plain = [dict(config) for config in configs]
        ids = list(range(len(plain))) if trial_ids is None else [int(t) for t in trial_ids]
        surrogate = None if width is None else Surrogate(factory, width=width, ratio=ratio)

        def build(config: dict[str, Any]) -> L.LightningModule:
            return factory(**config) if surrogate is None else surrogate.build(**config)  # type: ignore[return-value]

        by_id = dict(zip(ids, plain))
        return cls(
            [build(config) for config in plain],
            trial_ids=ids,
            trial_factory=lambda tid: build(by_id[tid]) if tid in by_id else None,
            **kwargs,
        )

    # -- the group -------------------------------------------------------------------------------------------

    @property
    def trial_ids(self) -> list[int]:
        """Ids of the running trials, in slot order."""
        return list(self._group.trial_ids)

    @property
    def free_slots(self) -> int:
        """How many more trials ``add_trial`` can take."""
        return self.max_slots - self._group.size

    @property
    def backend(self) -> str | None:
        """The backend in use (None until ``backend="auto"`` has chosen on the first batch)."""
        return None if self._backend is None else self._backend.name

    @property
    def results(self) -> dict[int, TrialResult]:
        """Every trial ever in the group: ``{id: {"status", "budget", "epochs", "steps", "metrics", ...}}``."""
        return self._book.results()

    def count_budget_in(self, unit: TimeAttr) -> None:
        """Give each trial's ``results[...]["budget"]`` in ``unit`` (a callback that counts steps sets ``"steps"``)."""
        self._book.count_budget_in(unit)

    def trial_record(self, trial_id: int) -> TrialRecord:
        """The trial's live record (not a copy, unlike ``results``): read it, do not change it."""
        if trial_id not in self._book:
            raise KeyError(f"trial_record: no trial {trial_id}; known trials: {sorted(self._book.records)}.")
        return self._book.records[trial_id]

    def training_epoch_values(self) -> dict[int, dict[str, float]]:
        """Each running trial's latest values, with this training epoch's values so far.

        What the module publishes in its ``on_train_epoch_end``, for callbacks, whose ``on_train_epoch_end``
        Lightning runs before the module's.
        """
        latest = {tid: dict(self._book.records[tid].metrics) for tid in self._group.trial_ids}
        for source in (self._metrics.step_values(), self._metrics.epoch_so_far("train")):
            for tid, values in source.items():
                if tid in latest:
                    latest[tid].update(values)
        return latest

    def trial_module(self, trial_id: int) -> L.LightningModule:
        """The trial's own module (bound to the stacked state while it runs)."""
        if trial_id in self._group.trial_ids:
            return self._group.modules[self._group.row_of(trial_id)]  # type: ignore[return-value]
        if trial_id in self._retired:
            return self._retired[trial_id]
        raise KeyError(f"No trial {trial_id}; known trials: {sorted(self._book.records)}.")

    def unfuse(self, trial_id: int) -> L.LightningModule:
        """A standalone copy of the trial's module with its trained weights and buffers."""
        module = copy.deepcopy(self.trial_module(trial_id))
        self._group.detach(module)  # its own compact tensors, not a copy of the whole stacked storage
        for param in module.parameters():
            param.grad = None
        return module

    @property
    def logged_names(self) -> frozenset[str]:
        """Every metric name the trials have logged so far (without ``/trial_{id}``), the sanity check included."""
        return frozenset(self._metrics.names)

    def stop_trial(self, trial_id: int, reason: str = "", *, status: TrialStatus = "stopped") -> None:
        """Remove a running trial from its slot: the stacked state shrinks, the others keep everything.

        Args:
            trial_id: the trial to stop.
            reason: recorded in ``results`` and shown in the summary table.
            status: ``"stopped"`` (a decision), ``"completed"`` (reached its budget) or ``"diverged"``.
        """
        if status not in ENDED_STATUSES:
            raise ValueError(f"stop_trial: status must be 'stopped', 'completed' or 'diverged', got {status!r}.")
        if trial_id not in self._group.trial_ids:
            raise KeyError(f"stop_trial: trial {trial_id} is not running; running trials: {self._group.trial_ids}.")
        self._book.update_metrics(trial_id, self._metrics.step_values().get(trial_id, {}))  # e.g. last train_loss
        self._metrics.reslot()
        if self._optimizer is not None:
            self._optimizer.materialize()
        (module,) = self._group.remove([self._group.row_of(trial_id)])
        self._retired[trial_id] = module  # type: ignore[assignment]
        self._book.finish(trial_id, status, reason)
        self._loss_problems.pop(trial_id, None)
        self._verify_ids.discard(trial_id)
        if self._optimizer is not None:
            self._optimizer.trials.pop(trial_id, None)
            self._optimizer.rebuild()
            self._drop_scheduler_configs(trial_id)
        self._rebind_backends()
        self._fit_backend_to_group()
        if not self._group.trial_ids and self._trainer is not None:
            self.trainer.should_stop = True

    def add_trial(self, module: L.LightningModule, trial_id: int | None = None) -> int:
        """Put a new trial into a free slot, with fresh optimizer state; returns its id."""
        if not isinstance(module, L.LightningModule):
            raise TypeError(f"add_trial: expected a lightning.LightningModule, got {type(module).__name__}.")
        if self.free_slots <= 0:
            raise RuntimeError(
                f"add_trial: all {self.max_slots} slots are taken; stop a trial first or create the group with "
                "a larger max_slots."
            )
        if any(module is m for m in self._group.modules):
            raise ValueError("add_trial: this module is already in the group.")
        tid = self._book.next_id() if trial_id is None else int(trial_id)
        if tid in self._book:
            raise ValueError(f"add_trial: trial id {tid} is already used; known ids: {sorted(self._book.records)}.")
        if not module.automatic_optimization:
            raise ValueError("add_trial: the trial uses manual optimization; fused trials need automatic optimization.")
        self._check_newcomer_fuses(module, tid)
        module.to(device=self._group.device)
        self._set_mode_of_newcomer(module)
        self._metrics.reslot()
        if self._optimizer is not None:
            self._optimizer.materialize()
        self._group.append(module, tid)
        self._book.add(tid)
        if self._trainer is not None:
            attach_trainer(module, self.trainer, tid)
        if self._optimizer is not None:
            self._optimizer.trials[tid] = self._configure_trial_optimizer(tid, module)
            self._optimizer.rebuild()
            self.trainer.strategy.lr_scheduler_configs.extend(self._scheduler_configs(tid))
        self._rebind_backends()
        self._fit_backend_to_group()
        if self._backend is not None:
            self._book.set_backend([tid], (self._backend if self._parked is None else self._parked).name)
        if self._verify_enabled and self._backend_name != "loop":
            self._verify_ids.add(tid)
        return tid

    def _check_newcomer_fuses(self, module: L.LightningModule, tid: int) -> None:
        """A newcomer that differs in a Python value the fused code reads: refused, or auto moves to the loop."""
        backend = self._parked or self._backend
        if not isinstance(backend, VmapBackend):
            return
        refusal = backend.refusal([*self._group.modules, module], [*self._group.trial_ids, tid])
        if refusal is None:
            return
        if self._backend_name != "auto":
            try:
                raise refusal
            finally:  # break the frame -> error -> traceback -> frame cycle
                refusal = None
        rank_zero_warn(f"FusedLightningModule: backend='auto' runs the group on 'loop' from now on: {refusal}")
        self._backend, self._parked = make_backend("loop", self._group), None

    def _running(self) -> list[tuple[int, L.LightningModule]]:
        return list(zip(self._group.trial_ids, self._group.modules))  # type: ignore[arg-type]

    # -- module plumbing: devices, modes, hooks the trials implement ---------------------------------------------

    @override
    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> FusedLightningModule:
        super()._apply(fn, recurse)
        self._group.bind()
        for module in [*self._group.modules, *self._retired.values()]:
            module.to(device=self._group.device)  # updates each trial's `self.device`; bound tensors are already there
        self._rebind_backends()
        return self

    def _rebind_backends(self) -> None:
        for backend in [self._backend, *self._eval_fallback.values()]:
            if backend is not None:
                backend.rebind()

    def _fit_backend_to_group(self) -> None:
        """With ``backend="auto"``, a group left with one trial runs it on the loop, and a newcomer undoes that.

        auto times the backends once, on the first batch, and its choice stays while early stopping shrinks the
        group, except at one trial: then there is nothing to batch, and the loop runs the trial's own module
        faster (1.8-1.9x on the digits MLP, 1.4x on ResNet-18: docs/fused.md, docs/hfta.md); the same
        results to float rounding.
        """
        if self._backend_name != "auto" or (self._backend is None and self._parked is None):
            return
        if self._group.size == 1 and self._parked is None and not isinstance(self._backend, LoopBackend):
            self._parked, self._backend = self._backend, make_backend("loop", self._group)
            rank_zero_info("FusedLightningModule: one trial left; backend='auto' runs it on 'loop' from now on.")
        elif self._group.size > 1 and self._parked is not None:
            self._backend, self._parked = self._parked, None
            self._backend.rebind()
            rank_zero_info(f"FusedLightningModule: {self._group.size} trials; back to {self._backend.name!r}.")

    @override
    def train(self, mode: bool = True) -> FusedLightningModule:
        super().train(mode)
        for module in self._group.modules:
            module.train(mode)
        return self

    def _first(self) -> L.LightningModule:
        return self._group.modules[0]  # type: ignore[return-value]

    # Lightning records and restores the train/eval mode of the LightningModule's submodules around
    # evaluation; the trial modules are not submodules, so their modes are recorded and restored here.
    def _capture_modes(self) -> None:
        modules = [*self.modules(), *(m for trial in self._group.modules for m in trial.modules())]
        self._saved_modes = [(m, m.training) for m in modules]

    def _set_mode_of_newcomer(self, module: nn.Module) -> None:
        """A trial added during evaluation trains after it, like the others: record that mode for the restore."""
        before_evaluation = next((mode for m, mode in getattr(self, "_saved_modes", []) if m is self), None)
        if before_evaluation is None:
            module.train(self.training)
            return
        module.train(before_evaluation)
        self._saved_modes += [(m, m.training) for m in module.modules()]
        module.eval()

    def _restore_modes(self) -> None:
        for module, mode in getattr(self, "_saved_modes", []):
            module.training = mode
        self._saved_modes = []

    @override
    def on_validation_model_eval(self) -> None:
        self._capture_modes()
        super().on_validation_model_eval()

    @override
    def on_validation_model_train(self) -> None:
        self._restore_modes()

    @override
    def on_test_model_eval(self) -> None:
        self._capture_modes()
        super().on_test_model_eval()

    @override
    def on_test_model_train(self) -> None:
        self._restore_modes()

    @override
    def on_predict_model_eval(self) -> None:
        self._capture_modes()
        super().on_predict_model_eval()

    @override
    def on_predict_end(self) -> None:
        self._restore_modes()

    @override
    def configure_callbacks(self) -> list[Callback]:
        """Lightning's callbacks configured for an unfused run act per trial: see :mod:`.trial_callbacks`."""
        refuse_module_callbacks(self._first())
        callbacks: list[Callback] = self.trainer.callbacks  # type: ignore[attr-defined]
        callbacks[:] = per_trial_callbacks(callbacks)
        return []

    @override
    def prepare_data(self) -> None:
        self._first().prepare_data()

    @override
    def setup(self, stage: str) -> None:
        precision = str(self.trainer.precision)
        if precision in ("16-mixed", "16", "16-mixed-amp"):
            raise ValueError(
                f"FusedLightningModule does not support precision={precision!r}: its one shared GradScaler would "
                "skip every trial's step whenever one trial overflows, coupling the trials. Use "
                "precision='bf16-mixed' (no loss scaling needed), '32-true' or '16-true'."
            )
        for tid, module in self._running():
            attach_trainer(module, self.trainer, tid)
            if is_overridden("setup", module, L.LightningModule):
                module.setup(stage)

    @override
    def train_dataloader(self) -> Any:
        return self._first().train_dataloader()

    @override
    def val_dataloader(self) -> Any:
        return self._first().val_dataloader()

    @override
    def test_dataloader(self) -> Any:
        return self._first().test_dataloader()

    @override
    def predict_dataloader(self) -> Any:
        return self._first().predict_dataloader()

    def _forward_hook(self, hook: str) -> None:
        phase = _FORWARDED_HOOKS[hook]
        for tid, module in self._running():
            if not is_overridden(hook, module, L.LightningModule):
                continue
            with capture_logs(module) as calls:
                getattr(module, hook)()
            if phase is not None:
                for call in calls:
                    self._metrics.record_epoch_value(phase, call.name, {tid: _as_float(call.value)})

    # -- optimization -----------------------------------------------------------------------------------------

    def _configure_trial_optimizer(self, tid: int, module: L.LightningModule) -> TrialOptimization:
        return parse_optimizer_config(module.configure_optimizers(), trial_id=tid, module=module)

    def _scheduler_configs(self, tid: int) -> list[LRSchedulerConfig]:
        assert self._optimizer is not None
        configs = []
        for spec in self._optimizer.trials[tid].schedulers:
            configs.append(
                LRSchedulerConfig(
                    scheduler=TrialScheduler(self._optimizer, tid, spec.scheduler),  # type: ignore[arg-type]
                    name=None if spec.name is None else f"{spec.name}/trial_{tid}",
                    interval=spec.interval,
                    frequency=spec.frequency,
                    reduce_on_plateau=spec.reduce_on_plateau,
                    monitor=None if spec.monitor is None else f"{spec.monitor}/trial_{tid}",
                    strict=spec.strict,
                )
            )
        return configs

    def _drop_scheduler_configs(self, tid: int) -> None:
        if self._trainer is None:
            return
        configs = self.trainer.strategy.lr_scheduler_configs
        configs[:] = [c for c in configs if getattr(c.scheduler, "trial_id", None) != tid]

    @override
    def configure_optimizers(self) -> Any:
        trials = {tid: self._configure_trial_optimizer(tid, module) for tid, module in self._running()}
        self._optimizer = TrialGroupOptimizer(
            self._group, trials, path=self._optimizer_path, is_skipped=lambda: self._loss_problems
        )
        configs = [config for tid in self._group.trial_ids for config in self._scheduler_configs(tid)]
        return [self._optimizer], [vars(c).copy() for c in configs]

    @override
    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    @override
    def configure_gradient_clipping(
        self,
        optimizer: Any,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        if self._optimizer is not None:  # each trial as Lightning clips it alone: see fused/trial_clipping.py
            clip_trial_gradients(self._group, self._optimizer, gradient_clip_val, gradient_clip_algorithm)

    # -- steps --------------------------------------------------------------------------------------------------

    def _training_forward_backward(self, backend: Backend, batch: Any, batch_idx: int) -> None:
        loss = backend.run("training_step", batch, batch_idx).loss()
        if loss is not None:
            torch.where(torch.isfinite(loss.detach()), loss, torch.zeros_like(loss)).sum().backward()

    def _resolve_backend(self, batch: Any, batch_idx: int) -> Backend:
        if self._backend is None:
            candidates: list[tuple[str, Callable[[], Backend]]] = [
                (name, partial(make_backend, name, self._group)) for name in ("hfta", "vmap", "loop")
            ]
            with preserved_metric_states(self._group.modules):  # timing steps must not count in torchmetrics
                choice = choose_backend(
                    self._group,
                    candidates,
                    lambda b: self._training_forward_backward(b, batch, batch_idx),
                    timed=not self.deterministic,
                )
            self._backend = choice.backend
            self._book.set_backend(self._group.trial_ids, choice.backend.name)
            self.backend_report = f"FusedLightningModule: {choice.describe()}{deferred_note(choice.backend)}."
            rank_zero_info(self.backend_report)
        return self._backend

    def _verify(self, backend: Backend, batch: Any, batch_idx: int) -> None:
        ids = [tid for tid in self._group.trial_ids if tid in self._verify_ids]
        # the loop runs each trial's own code: nothing to check; otherwise a skipped batch checks the next one
        try:
            with preserved_metric_states(self._group.modules):  # the checked steps must not count in torchmetrics
                if (
                    ids
                    and not isinstance(backend, LoopBackend)
                    and not verify_fusion(self._group, backend, ids, batch, batch_idx)
                ):
                    return
        except FusionMismatchError as err:
            if self._backend_name != "auto":
                raise
            rank_zero_warn(f"FusedLightningModule: backend='auto' runs the group on 'loop' from now on: {err}")
            self._backend, self._parked = make_backend("loop", self._group), None
        self._verify_ids.difference_update(ids)

    def _record_logs(self, phase: str, hook: str, logs: list[StackedLog], batch: Any) -> None:
        batch_size: int | None = None
        for log in logs:
            options = resolve_options(hook, log.options)
            if isinstance(log.values, list):  # per-trial objects (torchmetrics Metric): computed at epoch end
                values = {tid: v for tid, v in zip(self._group.trial_ids, log.values)}
                self._metrics.record_objects(phase, log.name, values, options)
                continue
            size = log.options.get("batch_size")
            if size is None and options.on_epoch:  # only epoch means are weighted by the batch size
                if batch_size is None:
                    batch_size = extract_batch_size(batch)
                size = batch_size
            self._metrics.record(
                phase, log.name, log.values, options, trial_ids=self._group.trial_ids, batch_size=size or 1
            )

    @override
    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:
        if not self._group.trial_ids:
            return None  # every trial has stopped; Lightning ends the fit at its next check
        backend = self._resolve_backend(batch, batch_idx)
        if self._verify_ids:
            self._verify(backend, batch, batch_idx)
            backend = self._backend or backend  # a failed check under auto moved the group to the loop
        out = backend.run("training_step", batch, batch_idx)
        self._record_logs("train", "training_step", out.logs, batch)
        loss = out.loss()
        if loss is None:
            return None
        loss = loss.reshape(self._group.size)
        finite = torch.isfinite(loss.detach())
        if bool(finite.all()):
            return loss.sum()
        for tid, ok in zip(self._group.trial_ids, finite.tolist()):
            if not ok:
                self._loss_problems.setdefault(tid, "non-finite loss")
        return torch.where(finite, loss, torch.zeros_like(loss)).sum()

    def _eval_backend(self, method: str) -> Backend:
        if method in self._eval_fallback:
            return self._eval_fallback[method]
        if self._backend is not None:
            return self._backend
        # backend="auto" has not timed anything yet (e.g. the sanity check before the first training batch)
        return self._eval_fallback.setdefault("auto", make_backend("loop", self._group))

    def _run_eval(self, method: str, *args: Any) -> StepOutputs:
        if not self._group.trial_ids:
            return StepOutputs(output=None, per_row=[])
        backend = self._eval_backend(method)
        try:
            return backend.run(method, *args)
        except FusionError as err:
            if isinstance(backend, LoopBackend):
                raise
            rank_zero_warn(
                f"FusedLightningModule: {method} cannot run under backend={backend.name!r}, so it runs per trial "
                f"with backend='loop' (training is unaffected). Reason: {err}"
            )
            self._eval_fallback[method] = make_backend("loop", self._group)
            return self._eval_fallback[method].run(method, *args)

    def _eval_args(self, method: str, batch: Any, batch_idx: int, dataloader_idx: int | None) -> tuple[Any, ...]:
        if (
            dataloader_idx is not None
            and "dataloader_idx" in inspect.signature(getattr(self._first(), method)).parameters
        ):
            return (batch, batch_idx, dataloader_idx)
        return (batch, batch_idx)

    @override
    def forward(self, *args: Any) -> Any:
        """Every running trial's forward on the same input, stacked along a leading trial dimension."""
        return self._run_eval("forward", *args).output

    @override
    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int | None = None) -> None:
        out = self._run_eval("validation_step", *self._eval_args("validation_step", batch, batch_idx, dataloader_idx))
        self._record_logs("validate", "validation_step", out.logs, batch)

    @override
    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int | None = None) -> None:
        out = self._run_eval("test_step", *self._eval_args("test_step", batch, batch_idx, dataloader_idx))
        self._record_logs("test", "test_step", out.logs, batch)

    @override
    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int | None = None) -> dict[int, Any]:
        """Each running trial's prediction for the batch, by trial id."""
        out = self._run_eval("predict_step", *self._eval_args("predict_step", batch, batch_idx, dataloader_idx))
        ids = self._group.trial_ids
        if out.per_row is not None:
            return dict(zip(ids, out.per_row))
        if isinstance(out.output, Tensor):
            return {tid: out.output[row] for row, tid in enumerate(ids)}
        if isinstance(out.output, dict):
            return {tid: {k: v[row] for k, v in out.output.items()} for row, tid in enumerate(ids)}
        return dict.fromkeys(ids)

    # -- per-batch and per-epoch bookkeeping ----------------------------------------------------------------------

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._open_batch = batch_idx  # a checkpoint written before on_train_batch_end must settle the batch

    @override
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._open_batch = None
        if batch_idx + 1 >= self.trainer.num_training_batches:
            # before validation, so that decisions taken after it see this epoch in each trial's budget
            self._book.count_epoch(self._group.trial_ids)
        report = self._optimizer.last_report if self._optimizer is not None else None
        if report is None or not (report.stepped or report.diverged):
            return  # accumulating gradients: no optimizer step yet
        self._optimizer.last_report = StepReport()  # type: ignore[union-attr]
        self._loss_problems.clear()
        self._book.stepped(report.stepped)
        for tid, reason in report.diverged.items():
            self.stop_trial(tid, reason, status="diverged")  # it records the trial's last step values
        trainer = self.trainer
        if trainer.loggers and self._should_log_step():
            flat = {
                f"{name}/trial_{tid}": value
                for tid, values in self._metrics.step_values(logger_only=True).items()
                for name, value in values.items()
            }
            if flat:
                for logger in trainer.loggers:
                    logger.log_metrics(flat, step=trainer.global_step)
        if trainer.progress_bar_callback is not None:
            self._log_progress()

    def _should_log_step(self) -> bool:
        every = getattr(self.trainer, "log_every_n_steps", 50)  # set by Lightning's logger connector
        return bool(every) and self.trainer.global_step % every == 0

    def _log_progress(self) -> None:
        counts = self._book.counts()
        self.log("trials", float(counts["running"]), prog_bar=True, logger=False)
        for status in ("stopped", "diverged"):
            if counts[status]:
                self.log(status, float(counts[status]), prog_bar=True, logger=False)

    def _publish_epoch(self, phase: str) -> None:
        """Log each trial's epoch values as ``name/trial_{id}`` and keep them in the results."""
        options = self._metrics.epoch_options(phase)
        values = self._metrics.finish_epoch(phase)
        if self.trainer.sanity_checking:
            return
        for tid, metrics in values.items():
            self._book.record_metrics(tid, metrics)
            for name, value in metrics.items():
                self.log(
                    f"{name}/trial_{tid}",
                    value,
                    on_step=False,
                    on_epoch=True,
                    # None means Lightning's default (True) without its warning when no logger is configured
                    logger=None if name not in options or options[name].logger else False,
                    batch_size=1,
                )

    @override
    def on_fit_start(self) -> None:
        self._book.set_status(self._group.trial_ids, "running")
        self._forward_hook("on_fit_start")

    @override
    def on_train_start(self) -> None:
        for tid, reason in self._diverged_on_resume.items():  # optimizer state is restored by now
            if tid in self._group.trial_ids:
                self.stop_trial(tid, reason, status="diverged")
        self._diverged_on_resume, self._open_batch = {}, None
        self._book.resume_epoch(self.current_epoch, self._group.trial_ids)
        self._forward_hook("on_train_start")

    @override
    def on_train_epoch_start(self) -> None:
        self._book.start_epoch(self._group.trial_ids, self.current_epoch)
        self._forward_hook("on_train_epoch_start")

    @override
    def on_train_epoch_end(self) -> None:
        self._forward_hook("on_train_epoch_end")
        for tid, values in self._metrics.step_values().items():
            self._book.update_metrics(tid, values)
        self._publish_epoch("train")
        # a loader of unknown length has no recognisable last batch: the epoch is credited here instead
        self._book.end_epoch(self.current_epoch, self._group.trial_ids)

    @override
    def on_validation_epoch_start(self) -> None:
        self._forward_hook("on_validation_epoch_start")

    @override
    def on_validation_epoch_end(self) -> None:
        self._forward_hook("on_validation_epoch_end")
        self._publish_epoch("validate")

    @override
    def on_test_epoch_start(self) -> None:
        self._forward_hook("on_test_epoch_start")

    @override
    def on_test_epoch_end(self) -> None:
        self._forward_hook("on_test_epoch_end")
        self._publish_epoch("test")

    @override
    def on_train_end(self) -> None:
        self._forward_hook("on_train_end")

    @override
    def on_fit_end(self) -> None:
        self._forward_hook("on_fit_end")
        if not self.trainer.interrupted:
            self._book.set_status(self._group.trial_ids, "completed")
        if self.summary and self.trainer.is_global_zero:
            # plain stdout (the progress bar is finished): Lightning's print goes through the bar, to stderr
            print(format_results_table(self._book.records, monitor=self.monitor, mode=self.mode))

    # -- checkpoints ---------------------------------------------------------------------------------------------

    def _unsettled_batch(self) -> tuple[StepReport, bool] | None:
        """Between this module's train-batch start and end hooks: the batch's report, and if it ends the epoch."""
        if self._open_batch is None:
            return None
        report = self._optimizer.last_report if self._optimizer is not None else StepReport()
        return report, self._open_batch + 1 >= self.trainer.num_training_batches

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        book, diverged = self._book, {}
        unsettled = self._unsettled_batch()
        if unsettled is not None:  # Lightning will not rerun this batch's hooks on resume: save their effect
            report, epoch_done = unsettled
            book = book.settled(report.stepped, self._group.trial_ids, epoch_done=epoch_done)
            diverged = dict(report.diverged)
        checkpoint[_CHECKPOINT_KEY] = {
            "trial_ids": list(self._group.trial_ids),
            "max_slots": self.max_slots,
            "backend": self.backend if self._parked is None else self._parked.name,
            "records": book.results(),
            "epoch": book.epoch_state(),
            "diverged": diverged,  # trials to mark diverged when the fit resumes
            "retired": {
                tid: {k: v.detach().cpu() for k, v in m.state_dict().items()} for tid, m in self._retired.items()
            },
            "specs": {tid: module_spec(self.trial_module(tid)) for tid in self._book.records},
        }

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if _CHECKPOINT_KEY not in checkpoint:
            raise KeyError(
                "This checkpoint was not written by a FusedLightningModule (it has no 'lightning_hydro' entry); "
                "load it into the trial module's own class instead."
            )
        data = checkpoint[_CHECKPOINT_KEY]
        known = rebuild_trials(data["specs"], {**self._retired, **dict(self._running())}, self.trial_factory)
        live = list(data["trial_ids"])
        for module in self._group.modules:
            self._group.detach(module)
        padded = self._group.pad_widths
        self._group = StackedState(self.stacked, [known[tid] for tid in live], live, pad_widths=padded)
        self._retired = {tid: m for tid, m in known.items() if tid not in live}
        for tid, state in data["retired"].items():
            self._retired[tid].load_state_dict(state)
        self._book.load(data["records"])
        if "epoch" in data:  # absent from checkpoints of earlier versions
            self._book.load_epoch_state(data["epoch"])
        self._diverged_on_resume = dict(data.get("diverged", {}))
        self.max_slots = data["max_slots"]
        self._verify_ids.clear()
        name = data.get("backend") or self._backend_name
        self._backend = None if name == "auto" else make_backend(name, self._group)
        self._parked = None
        self._fit_backend_to_group()
        if self._trainer is not None:
            for tid, module in self._running():
                attach_trainer(module, self.trainer, tid)
