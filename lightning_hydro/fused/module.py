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
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor, nn
from typing_extensions import override

from lightning_hydro.backends import BackendName, StepOutputs
from lightning_hydro.backends.auto import choose_backend
from lightning_hydro.backends.compiled_step import CompileSetting, check_compile_setting
from lightning_hydro.fused.arguments import check_deterministic, check_fused_arguments, check_precision
from lightning_hydro.fused.evaluation.hooks import EvaluationHooks
from lightning_hydro.fused.evaluation.modes import TrialModes
from lightning_hydro.fused.evaluation.steps import EvaluationSteps
from lightning_hydro.fused.group.slots import TrialSlots
from lightning_hydro.fused.group.specs import trials_from_configs
from lightning_hydro.fused.group.trial_layers import build_trial_layers, setup_checked
from lightning_hydro.fused.group.width_padding import width_optimizer_path
from lightning_hydro.fused.lightning.batch_hooks import TrialBatchHooks, batch_of
from lightning_hydro.fused.lightning.batch_transfer import BatchTransfer
from lightning_hydro.fused.lightning.callbacks import per_trial_callbacks, refuse_module_callbacks
from lightning_hydro.fused.lightning.early_stopping import may_stop_early
from lightning_hydro.fused.lightning.group_access import (
    GroupHyperparameters,
    trial_attribute_error,
    trial_attribute_refusal,
    warn_group_unaware_callbacks,
)
from lightning_hydro.fused.lightning.group_checkpoint import (
    CHECKPOINT_KEY,
    group_checkpoint_for_trial,
    group_state,
    load_group_checkpoint,
    recorded_trials,
    restore_group,
)
from lightning_hydro.fused.lightning.hooks import EPOCH_END_HOOKS, forward_hook, hide_absent_hooks
from lightning_hydro.fused.lightning.trainer_view import attach_trainer
from lightning_hydro.fused.lightning.trial_checkpoint_hooks import ENTRIES_KEY, load_trial_entries, save_trial_entries
from lightning_hydro.fused.lightning.trial_optimizer_steps import GroupStep, TrialOptimizerSteps
from lightning_hydro.fused.logging.metrics import TrialMetrics
from lightning_hydro.fused.logging.publisher import TrialPublisher
from lightning_hydro.fused.optimization import TrialOptimizers
from lightning_hydro.fused.rank_sync import RankSync
from lightning_hydro.fused.roster import TrialRoster
from lightning_hydro.fused.step.backend_policy import BackendPolicy, Chooser
from lightning_hydro.fused.step.manual_steps import ManualSteps, choose_loop_for_manual
from lightning_hydro.fused.step.row_health import RowHealth
from lightning_hydro.fused.step.training_step import TrainingStep
from lightning_hydro.optim.group_optimizer import OptimizerPath, TrialGroupOptimizer
from lightning_hydro.stacking.held_graphs import held_graph_tensors
from lightning_hydro.stacking.stacked_state import StackedState
from lightning_hydro.stopping.trial_record import (
    TimeAttr,
    TrialRecord,
    TrialResult,
    TrialStatus,
    format_results_table,
)

__all__ = ["FusedLightningModule"]

# the trials' hooks that run before a training epoch's first batch: a should_stop asked there ends the epoch at once
_BEFORE_THE_EPOCHS_BATCHES = frozenset({"on_fit_start", "on_train_start", "on_train_epoch_start"})


class FusedLightningModule(EvaluationHooks):
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
            module it refuses; each trial's own optimizer steps it (see :mod:`.group.width_padding`).
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
        monitor: metric that orders that table and marks the best trial (e.g. ``"val_acc"``). After ``fit``,
            ``validate`` and ``test``, ``trainer.callback_metrics`` and ``trainer.logged_metrics`` also hold that
            trial's values under the unfused names (``"val_acc"``, ``"test_acc"``: every name it logged, as its
            ``results`` entry holds them), for code that reads a metric back as for one model. Without
            ``monitor`` they hold each trial's ``"name/trial_{id}"`` only (unless the group has one trial).
        mode: ``"min"`` or ``"max"``: which ``monitor`` value is best.
        trial_factory: builds the module of a trial id (or returns None); used when a checkpoint holds
            trials that joined the group during the run (refills). Otherwise they are rebuilt as
            ``class(**hparams)`` (with their muP width scaling, if any).
        divergence_check_every: a diverged trial is skipped on the device at once, and its slot freed when the
            group's health is read back (one host sync): at optimizer steps 1, 2, 4, ... up to this, then every
            this many steps, at each epoch's end and before checkpoints. None: 1 on the CPU (where reading costs
            no wait), 32 on accelerators (see :mod:`.step.row_health`).
        compile: ``True`` runs the vmap/hfta training step (forward and backward) under ``torch.compile``, and
            the fused optimizer update too (:mod:`.step.compiled_update`). Once steady, the whole step is one
            compiled function (:mod:`.step.whole_step`); ``"reduce-overhead"`` records it as a CUDA graph on a GPU.
            What cannot be compiled runs eagerly, said in one log line. So does a compiled piece whose check
            (each one's first three calls also run eagerly) finds it computing otherwise, and Adam's update off
            the CPU (``FusedAdamUpdate.COMPILED_ON``). ``backend="auto"`` times the candidates eagerly and compiles
            the faster of hfta and vmap; it takes the (eager) loop only where neither runs the model.

    Trials that use manual optimization (``automatic_optimization = False``: several optimizers, a GAN) run their
    own ``training_step`` one after another on the loop backend, each stepping its own optimizers (see
    :mod:`lightning_hydro.fused.step.manual_steps`); ``backend="auto"`` chooses the loop for them.

    Raises:
        ValueError / TypeError: an empty list, non-LightningModules, trials of which some use manual optimization
            and some not, duplicate ids, an unknown backend, or trials of different architectures (the message
            names the trial and the tensors that differ).
        FusionError: ``backend="vmap"`` or ``"hfta"`` for trials that use manual optimization.
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
        divergence_check_every: int | None = None,
        compile: CompileSetting = False,
        pad_widths: bool = False,
    ) -> None:
        super().__init__()
        trials = list(trials)
        ids = list(range(len(trials))) if trial_ids is None else [int(t) for t in trial_ids]
        check_fused_arguments(trials, ids, backend, max_slots, optimizer_path, mode)
        for tid, trial in zip(ids, trials):
            build_trial_layers(trial, tid, "FusedLightningModule")  # configure_model's layers; lazy ones refused
        self.stacked = nn.Module()  # holds the stacked tensors, so that .to(), state_dict() and Lightning see them
        optimizer_path = width_optimizer_path(trials, ids, pad_widths=pad_widths, optimizer_path=optimizer_path)
        slots = max_slots if max_slots is not None else len(trials)
        self._slots = TrialSlots(self.stacked, trials, ids, slots, pad_widths=pad_widths)
        self.deterministic = check_deterministic(deterministic)
        compile = check_compile_setting(compile)
        self._policy = BackendPolicy(
            backend,
            self._slots,
            verify=verify,
            deterministic=self.deterministic,
            compile=compile,
        )
        self._health = RowHealth(check_every=divergence_check_every)
        self._metrics = TrialMetrics()
        self._modes = TrialModes()
        self.automatic_optimization = trials[0].automatic_optimization  # the same for all (checked)
        self._manual = None if self.automatic_optimization else ManualSteps(self._slots, self._health)
        self._optimizers = TrialOptimizers(self._slots, optimizer_path, self._manual, compile=compile)
        self._ranks = RankSync()  # several processes (DDP): every rank holds and decides the same trials
        self._roster = TrialRoster(
            self._policy, self._optimizers, self._metrics, self._health, self._modes, self._ranks.mark_rows_changed
        )
        self._eval_steps = EvaluationSteps(self._policy, self._optimizers)
        self._publisher = TrialPublisher(self._slots, self._metrics)
        self._training_step = TrainingStep(
            self._policy, self._metrics, self._health, self._ranks, model_name=type(trials[0]).__name__
        )
        self._batch_hooks = TrialBatchHooks(self._slots, self._metrics, self._trial_optimizer)
        self._step_out: StepOutputs | None = None  # the latest manual or evaluation step's outputs (batch hooks)
        self._diverged_on_resume: dict[int, str] = {}
        self._open_batch: int | None = None
        # a trial a callback stops after its step in a batch, or within a training epoch, still gets its own
        # on_train_batch_end / on_train_epoch_end for it, as alone (trainer.should_stop ends the fit after them)
        self._stepped_batch: tuple[Any, int] | None = None  # the open batch and its index, once its step ran
        self._epoch_open = False
        self._owed_batch_end: list[tuple[int, nn.Module, tuple[Any, ...]]] = []
        self._owed_epoch_end: list[tuple[int, nn.Module]] = []
        self.summary = summary
        self.monitor = monitor
        self.mode = mode
        self.trial_factory = trial_factory
        hide_absent_hooks(self, trials[0])  # Lightning then sees the loops of an unfused run
        self._batch_transfer = BatchTransfer(self._slots, trials[0])  # the trials' batch-transfer hooks
        self._batch_transfer.install(self)
        self._trial_steps = TrialOptimizerSteps()  # the trials' own optimizer_step, if they override it
        # under ddp_spawn the group's state returns to this process with the weights (see rank_sync.py)
        self.register_state_dict_post_hook(_hand_back_group)
        self.register_load_state_dict_pre_hook(_take_back_group)
        self._hparams = GroupHyperparameters()  # a trial's hparams read on the group: said where they are
        self.__dict__["_group_ready"] = True  # from here on, an attribute of the trials set on the group is refused

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            trial = self._trial_holding(name)
            if trial is None:
                raise
            raise trial_attribute_error(name, self._slots.trial_ids, type(trial).__name__) from None

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_group_ready") and name not in self.__dict__:
            trial = self._trial_holding(name)  # (a callback's pl_module.flag = True, alone the trial's own)
            if trial is not None:
                raise trial_attribute_refusal(name, self._slots.trial_ids, type(trial).__name__)
        super().__setattr__(name, value)

    def _trial_holding(self, name: str) -> nn.Module | None:
        """A running trial that has attribute ``name`` where the group has none (fused/lightning/group_access.py)."""
        found = self.__dict__
        if name.startswith("_") or "_group_ready" not in found or hasattr(type(self), name):
            return None
        if any(name in found.get(store, {}) for store in ("_parameters", "_buffers", "_modules")):
            return None
        slots = found.get("_slots")
        for module in () if slots is None else slots.group.modules:
            own = vars(module)
            if name in own or any(name in own.get(store, {}) for store in ("_parameters", "_buffers", "_modules")):
                return module
            if hasattr(type(module), name):
                return module
        return None

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
        modules, ids, trial_factory = trials_from_configs(
            factory, configs, width=width, ratio=ratio, trial_ids=trial_ids
        )
        return cls(modules, trial_ids=ids, trial_factory=trial_factory, **kwargs)

    # -- the group -------------------------------------------------------------------------------------------

    @property
    def _group(self) -> StackedState:
        return self._slots.group

    @property
    def _optimizer(self) -> TrialGroupOptimizer | None:
        return self._slots.optimizer

    @property
    def optimizer_source(self) -> TrialOptimizers:
        """Where each trial's own optimizers and LR schedulers are kept.

        Package-internal: the per-trial views of the Trainer (``self.optimizers()`` in a trial's hook, the
        per-trial callbacks' trainer) read a trial's optimizers from it.
        """
        return self._optimizers

    @property
    def backend_report(self) -> str:
        """How ``backend="auto"`` chose (empty until it has)."""
        return self._policy.report

    @property
    def compile_report(self) -> str:
        """What ``compile=`` did so far, in one line: the training steps run whole, their checks, what ran eagerly.

        E.g. ``compile=True: 11 training steps ran whole (forward, backward and update as one compiled function); 3
        checked against the same step run eagerly, the largest difference 0.0012 of what float rounding allows``.
        Logged (INFO) at the end of each fit with ``compile=``.
        """
        return self._training_step.compile_report(self._optimizers.compiled_update_failure)

    @property
    def max_slots(self) -> int:
        """How many trials the group may hold at once."""
        return self._slots.max_slots

    @property
    def trial_ids(self) -> list[int]:
        """Ids of the running trials, in slot order."""
        return list(self._slots.trial_ids)

    @property
    def free_slots(self) -> int:
        """How many more trials ``add_trial`` can take."""
        return self._slots.free

    @property
    def backend(self) -> str | None:
        """The backend in use (None until ``backend="auto"`` has chosen on the first batch)."""
        return self._policy.name

    @property
    def results(self) -> dict[int, TrialResult]:
        """Every trial ever in the group: ``{id: {"status", "budget", "epochs", "steps", "metrics", ...}}``.

        Steps and divergences are read back from the device at the points :mod:`.step.row_health` lists; call
        :meth:`read_health` first for counts exact to the last step.
        """
        return self._slots.book.results()

    def count_budget_in(self, unit: TimeAttr) -> None:
        """Give each trial's ``results[...]["budget"]`` in ``unit`` (a callback that counts steps sets ``"steps"``)."""
        self._slots.book.count_budget_in(unit)

    def trial_record(self, trial_id: int) -> TrialRecord:
        """The trial's live record (not a copy, unlike ``results``): read it, do not change it."""
        if trial_id not in self._slots.book:
            raise KeyError(f"trial_record: no trial {trial_id}; known trials: {sorted(self._slots.book.records)}.")
        return self._slots.book.records[trial_id]

    def training_epoch_values(self) -> dict[int, dict[str, float]]:
        """Each running trial's latest values, with this training epoch's values so far.

        What the module publishes in its ``on_train_epoch_end``, for callbacks, whose ``on_train_epoch_end``
        Lightning runs before the module's.
        """
        return self._publisher.training_epoch_values()

    def trial_module(self, trial_id: int) -> L.LightningModule:
        """The trial's own module (bound to the stacked state while it runs)."""
        return self._slots.module(trial_id)  # type: ignore[return-value]

    def unfuse(self, trial_id: int) -> L.LightningModule:
        """A standalone copy of the trial's module with its trained weights and buffers."""
        trial = self.trial_module(trial_id)
        # a tensor the step kept as an attribute (the Lightning GAN tutorial's self.generated_imgs, or in the outputs
        # list of Lightning's docs) is part of an autograd graph, which deepcopy refuses: the copy gets it detached
        memo: dict[int, Any] = {id(value): value.detach().clone() for _, _, value in held_graph_tensors(trial)}
        module = copy.deepcopy(trial, memo)
        self._group.detach(module)  # its own compact tensors, not a copy of the whole stacked storage
        for param in module.parameters():
            param.grad = None
        return module

    @property
    def logged_names(self) -> frozenset[str]:
        """Every metric name the trials have logged so far (without ``/trial_{id}``), the sanity check included."""
        return frozenset(self._metrics.names)

    def read_health(self) -> None:
        """Read the rows' health back from the device (one sync): count steps, free diverged trials' slots."""
        self._roster.settle_health(self._trainer, credit_epoch=False)

    def stop_trial(self, trial_id: int, reason: str = "", *, status: TrialStatus = "stopped") -> None:
        """Remove a running trial from its slot: the stacked state shrinks, the others keep everything.

        The fit ends once no trial runs, checked in the module's hooks after the callbacks' (so a callback may
        stop the last trial and refill its slot in the same hook).

        Args:
            trial_id: the trial to stop.
            reason: recorded in ``results`` and shown in the summary table.
            status: ``"stopped"`` (a decision), ``"completed"`` (reached its budget) or ``"diverged"``.
        """
        self._eval_steps.refuse_slot_change("stop_trial", self._trainer)
        batch_end, epoch_end = self._hooks_owed_to(trial_id)
        if batch_end or epoch_end:  # its hooks see its own optimizers and schedulers (self.optimizers()), as alone
            self._optimizers.keep_while_leaving(trial_id)
        try:
            self._roster.stop(self._trainer, trial_id, reason, status=status)
        finally:
            if trial_id in self._group.trial_ids:  # it did not leave (or the stop failed): nothing is owed
                self._optimizers.forget_left([trial_id])
        if trial_id not in self._group.trial_ids:
            self._owed_batch_end += batch_end
            self._owed_epoch_end += epoch_end

    def _hooks_owed_to(
        self, trial_id: int
    ) -> tuple[list[tuple[int, nn.Module, tuple[Any, ...]]], list[tuple[int, nn.Module]]]:
        """The trial's own batch-end and epoch-end hooks it would still run alone if stopped now (see __init__)."""
        if trial_id not in self._group.trial_ids:
            return [], []
        module = self.trial_module(trial_id)
        batch_end: list[tuple[int, nn.Module, tuple[Any, ...]]] = []
        stepped = self._stepped_batch
        if stepped is not None and is_overridden("on_train_batch_end", module, L.LightningModule):
            row = self._group.row_of(trial_id)
            if self._manual is None:
                output = self._batch_hooks.train_output(
                    self._training_step.outputs, row, self.trainer.accumulate_grad_batches
                )
                own_batch = batch_of(self._training_step.outputs, row, stepped[0])
            else:
                output = self._batch_hooks.train_output(self._step_out, row)
                own_batch = batch_of(self._step_out, row, stepped[0])
            batch_end.append((trial_id, module, (output, own_batch, *stepped[1:])))
        owes_epoch = self._epoch_open and is_overridden("on_train_epoch_end", module, L.LightningModule)
        return batch_end, [(trial_id, module)] if owes_epoch else []

    def add_trial(self, module: L.LightningModule, trial_id: int | None = None) -> int:
        """Put a new trial into a free slot, with fresh optimizer state; returns its id."""
        if isinstance(module, L.LightningModule):  # anything else is refused by its type first, at any stage
            self._eval_steps.refuse_slot_change("add_trial", self._trainer)
            build_trial_layers(module, self._slots.new_id(trial_id), "add_trial")
        tid = self._roster.add(self._trainer, self, module, trial_id)
        self._batch_hooks.refresh(self._group.modules)
        return tid

    def _trial_optimizer(self, trial_id: int) -> Any:
        optimization = self._optimizers.optimization(trial_id)
        return None if optimization is None else optimization.optimizer

    def _running(self) -> list[tuple[int, L.LightningModule]]:
        return self._slots.running()  # type: ignore[return-value]

    def _stop_requested_trials(
        self, *, epoch_ends: bool = True, at_batch_end: bool = False, asked_in: Collection[str] | None = None
    ) -> None:
        """Stop the trials whose own hooks set ``self.trainer.should_stop`` (:class:`.TrialStopRequests`).

        Called when the trials' hooks of a training batch, a training epoch or a validation run are done. As alone, a
        request waits until ``Trainer(min_epochs=..., min_steps=...)`` are reached (``epoch_ends``: at the end of the
        epoch, which then counts). ``at_batch_end``: within an epoch, where Lightning would validate a trial alone
        once more before its fit ends; fused it leaves now, unvalidated, which a warning says. ``asked_in``: only the
        requests of these hooks.
        """
        pending = self._roster.stops.pending
        if not pending or self.trainer.sanity_checking or not may_stop_early(self.trainer, epoch_ends=epoch_ends):
            return
        stopped = []
        for tid, hook in list(pending.items()):
            if asked_in is not None and hook not in asked_in:
                continue
            del pending[tid]
            if tid in self._group.trial_ids:
                self.stop_trial(tid, f"its {hook} set trainer.should_stop")
                stopped.append(tid)
        if stopped and at_batch_end and self.trainer.enable_validation:
            rank_zero_warn(
                f"FusedLightningModule: trial(s) {stopped} set trainer.should_stop in their own hooks within an "
                "epoch and left the group after this batch, with their weights as alone. Alone, Lightning would "
                "validate each once more before its fit ends; fused they were not, so their results hold the "
                "validation before. trainer.validate(fused, ...) after the fit evaluates every trial, ended ones too.",
                category=UserWarning,
            )

    def _end_fit_if_empty(self) -> None:
        # the one place that ends a fit for the group: from the module's own hooks, which Lightning runs after the
        # callbacks' (on_train_batch_end, on_validation_end and, but for EarlyStopping and checkpoints,
        # on_train_epoch_end), so a callback that stops the last trial may still refill its slot
        if not self._group.trial_ids:
            self.trainer.should_stop = True

    # -- module plumbing: devices, modes, hooks the trials implement ---------------------------------------------

    @override
    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> FusedLightningModule:
        super()._apply(fn, recurse)
        self._group.bind()
        for module in [*self._group.modules, *self._slots.retired.values()]:
            module.to(device=self._group.device)  # updates each trial's `self.device`; bound tensors are already there
        self._policy.rebind()
        return self

    @override
    def zero_grad(self, set_to_none: bool = True) -> None:
        # Lightning clears the module's gradients before validation and each stage; the trials are not submodules,
        # and under manual optimization their parameters hold gradients of their own (accumulated over batches)
        super().zero_grad(set_to_none)
        for module in self._group.modules:
            module.zero_grad(set_to_none)

    @override
    def train(self, mode: bool = True) -> FusedLightningModule:
        super().train(mode)
        for module in self._group.modules:
            module.train(mode)
        return self

    def _first(self) -> L.LightningModule:
        """A trial module for the hooks every trial shares (data, callbacks): a running one, else a retired one.

        After early stopping has ended every trial (e.g. ``trainer.test`` after ``fit`` in a sweep job), the
        group is empty but the user's class still provides the data hooks.
        """
        if self._group.modules:
            return self._group.modules[0]  # type: ignore[return-value]
        return next(iter(self._slots.retired.values()))  # type: ignore[return-value]

    @override
    def configure_callbacks(self) -> list[Callback]:
        """Lightning's callbacks configured for an unfused run act per trial: see :mod:`.lightning.callbacks`."""
        refuse_module_callbacks(self._first())
        callbacks: list[Callback] = self.trainer.callbacks  # type: ignore[attr-defined]
        callbacks[:] = per_trial_callbacks(callbacks)
        warn_group_unaware_callbacks(callbacks)
        return []

    @override
    def prepare_data(self) -> None:
        self._first().prepare_data()

    @override
    def setup(self, stage: str) -> None:
        check_precision(self.trainer.precision)
        self._metrics.reduce = self._ranks.setup(self.trainer)
        self._eval_steps.leave()  # after a stage that raised
        # test/validate/predict evaluate the ended trials too (see EvaluationSteps.enter): they are set up as well
        trials = self._running() if stage == "fit" else [*self._running(), *self._slots.retired.items()]
        # layers built in setup are refused, reassigned buffers adopted
        with setup_checked(self._group, stage, backend=self._policy.requested):
            stops = self._roster.stops if stage == "fit" else None  # a trial's own should_stop stops it in a fit
            for tid, module in trials:
                attach_trainer(module, self.trainer, tid, self._optimizers, stops)  # type: ignore[arg-type]
                if is_overridden("setup", module, L.LightningModule):
                    module.setup(stage)  # type: ignore[operator]

    @override
    def train_dataloader(self) -> Any:
        return self._first().train_dataloader()

    def _forward_hook(self, hook: str) -> None:
        running = self._running()
        phase = EPOCH_END_HOOKS.get(hook)
        if phase is not None and any(is_overridden(hook, m, L.LightningModule) for _, m in running):
            # alone, Lightning has put the epoch's values into the Trainer's metrics before the hook: the trials
            # read theirs there (read back only for a trial's hook: it waits for the device)
            self._publisher.put_epoch_values(self.trainer, phase)
        forward_hook(hook, running, self._metrics)
        self._group.adopt_reassigned_buffers()  # what their code reassigned goes into their rows

    # -- optimization: see fused/optimization.py ------------------------------------------------------------

    @override
    def configure_optimizers(self) -> Any:
        return self._optimizers.configure()

    @override
    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        # the closure runs training_step, which records each row's loss in self._health; the optimizer reads
        # the rows to skip from it after the closure, and reports what it did
        step = self._training_step

        def group_step(closure: Any) -> Any:
            return optimizer.step(closure=closure, skip=self._health, without_gradients=step.without_gradients)

        if "optimizer_step" in self._batch_hooks.overridden:  # the trials' own, around one group step
            optimizations = [(tid, m, self._optimizers.optimization(tid)) for tid, m in self._running()]
            own = [(tid, m, o.optimizer) for tid, m, o in optimizations if o is not None]
            own_state = lambda: optimizer.active_path == "universal"  # noqa: E731
            group = GroupStep(self._group, group_step, self._closure_losses, own_state, step.leave_out)
            stepped, report, logged = self._trial_steps.run(own, (epoch, batch_idx), optimizer_closure, group)
            self._group.adopt_reassigned_buffers()  # what their code reassigned goes into their rows
            self._batch_hooks.record("optimizer_step", logged, step.batch)
            if not stepped:  # (Lightning's docs' alternating schedule: the closure ran, no trial stepped)
                step.no_optimizer_step()
                return
        else:
            report = group_step(optimizer_closure)
        step.optimizer_stepped()
        self._health.absorb(report, self.trainer.global_step + 1)

    def _closure_losses(self) -> Tensor | None:
        """The ``[B]`` losses a trial's closure returns alone (detached, divided under gradient accumulation)."""
        outputs = self._training_step.outputs
        loss = None if outputs is None else outputs.loss()
        return None if loss is None else loss.detach().reshape(-1) / self.trainer.accumulate_grad_batches

    @override
    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        trial_id = getattr(scheduler, "trial_id", None)
        if trial_id in self._group.trial_ids:
            module = self.trial_module(trial_id)
            if is_overridden("lr_scheduler_step", module, L.LightningModule):
                # the trial's own rule, as Lightning asks for schedulers of other libraries (timm: step(epoch=...))
                module.lr_scheduler_step(scheduler.scheduler, metric)
                return
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
        group_optimizer = self._slots.optimizer  # each trial clipped as Lightning clips it alone
        if group_optimizer is not None:
            group_optimizer.clip_gradients(gradient_clip_val, gradient_clip_algorithm)

    # -- steps --------------------------------------------------------------------------------------------------

    def _manual_training_step(self, batch: Any, batch_idx: int) -> None:
        # manual optimization: each trial's own step runs in turn and steps its own optimizers (manual_steps.py)
        self._policy.for_training(lambda backend: None, choose_loop_for_manual, type(self._first()).__name__)
        assert self._manual is not None
        result = self._manual.run(batch, batch_idx)
        self._step_out = result.outputs.detached()  # for the trials' on_train_batch_end (no graph kept: see step/)
        self._metrics.record_step("train", "training_step", result.outputs.logs, self._group.trial_ids, batch)
        group_optimizer = self.optimizers()
        for _ in range(result.steps):
            # Lightning counts a manual run's steps (global_step) through the hooks its manual loop puts on the
            # module's LightningOptimizer around step(); the trials stepped their own optimizers, so count here
            group_optimizer._on_before_step()  # type: ignore[union-attr]
            group_optimizer._on_after_step()  # type: ignore[union-attr]
            self._health.absorb(result.report, self.trainer.global_step)
        # Lightning logs a manual run's step values after every batch, whether or not it stepped an optimizer
        self._health.mark_stepped()

    @override
    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:
        if not self._group.trial_ids:
            return None  # every trial has stopped (on_train_batch_start skips such batches)
        if self._manual is not None:
            self._manual_training_step(batch, batch_idx)
            self._publisher.put_step_values(self.trainer)
            self._stepped_batch = (batch, batch_idx)
            return None
        # the steady step, top to bottom: lightning_hydro/fused/step/ (the chooser is looked up here, so that tests
        # can replace the module's; several processes take rank 0's choice)
        loss = self._training_step(batch, batch_idx, self._chooser)
        self._publisher.put_step_values(self.trainer)  # as self.log's values alone: before any batch-end hook
        self._stepped_batch = (batch, batch_idx)
        return loss

    def _chooser(self) -> Chooser:
        return self._ranks.chooser(choose_backend, self.trainer)

    @override
    def backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        if self._fabric:  # LightningModule.backward's other branch
            super().backward(loss, *args, **kwargs)
        else:
            self._training_step.backward(loss, *args, **kwargs)

    # -- per-batch and per-epoch bookkeeping ----------------------------------------------------------------------

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        # asked in on_train_epoch_start (or a hook before it): alone, the epoch's loop then ends before any batch (a
        # batch-transfer hook, which runs before this, asks after Lightning's check: the batch still trains)
        self._stop_requested_trials(epoch_ends=False, asked_in=_BEFORE_THE_EPOCHS_BATCHES)
        if not self._group.trial_ids:  # the last trial left outside the hooks that end the fit (e.g. at epoch start)
            self.trainer.should_stop = True
            return -1  # Lightning's way to skip the rest of the epoch: no step runs for an empty group
        if self._ranks.rows_changed:
            self._ranks.rewrap(self.trainer)  # DDP's wrapper holds the rows it was built with
        self._open_batch = batch_idx  # a checkpoint written before on_train_batch_end must settle the batch
        self._stepped_batch = None
        if "on_train_batch_start" in self._batch_hooks.overridden:  # the trials' own hooks: lightning/batch_hooks.py
            return self._batch_hooks.train_batch_start(batch, batch_idx)
        return None

    @override
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if "on_train_batch_end" in self._batch_hooks.overridden:
            if self._manual is None:  # Lightning divides the loss under gradient accumulation
                self._batch_hooks.train_batch_end(
                    self._training_step.outputs, batch, batch_idx, self.trainer.accumulate_grad_batches
                )
            else:
                self._batch_hooks.train_batch_end(self._step_out, batch, batch_idx)
        if self._owed_batch_end:  # trials a callback stopped after this batch's step
            owed, self._owed_batch_end = self._owed_batch_end, []
            self._batch_hooks.run_left("on_train_batch_end", owed, batch)
            waiting = {tid for tid, _ in self._owed_epoch_end}
            self._optimizers.forget_left(tid for tid, _, _ in owed if tid not in waiting)
        self._open_batch, self._stepped_batch = None, None
        last = batch_idx + 1 >= self.trainer.num_training_batches
        stepped, read = self._health.end_batch(last=last)
        if read:  # due by the health's schedule, and at the epoch's last batch (before validation)
            self._roster.settle_health(self.trainer, credit_epoch=last)
        if stepped:  # not while accumulating gradients
            self._publisher.publish_step(self.trainer, self.log)
        self._stop_requested_trials(epoch_ends=last, at_batch_end=not last)
        self._end_fit_if_empty()

    @override
    def on_before_backward(self, loss: Tensor) -> None:
        if "on_before_backward" in self._batch_hooks.overridden:  # each trial with its own loss
            step = self._training_step
            accumulate = self.trainer.accumulate_grad_batches
            self._batch_hooks.before_backward(step.losses, step.batch, accumulate, step.rows_without_loss())

    @override
    def on_after_backward(self) -> None:
        if "on_after_backward" in self._batch_hooks.overridden:  # each trial with its own gradients
            step = self._training_step
            self._batch_hooks.around_the_update("on_after_backward", step.batch, step.rows_without_loss())

    @override
    def on_before_optimizer_step(self, optimizer: Any) -> None:
        if "on_before_optimizer_step" in self._batch_hooks.overridden:  # each trial with its own optimizer
            self._around_the_update("on_before_optimizer_step")

    @override
    def on_before_zero_grad(self, optimizer: Any) -> None:
        if "on_before_zero_grad" in self._batch_hooks.overridden:
            self._around_the_update("on_before_zero_grad")

    def _around_the_update(self, hook: str) -> None:
        step = self._training_step
        gradless = [self._group.row_of(tid) for tid in step.without_gradients()]
        self._batch_hooks.around_the_update(hook, step.batch, without_gradients=gradless)

    @override
    def on_fit_start(self) -> None:
        self._slots.book.set_status(self._group.trial_ids, "running")
        self._forward_hook("on_fit_start")

    @override
    def on_train_start(self) -> None:
        self._health.reset()
        for tid, reason in self._diverged_on_resume.items():  # optimizer state is restored by now
            if tid in self._group.trial_ids:
                self.stop_trial(tid, reason, status="diverged")
        self._diverged_on_resume, self._open_batch = {}, None
        self._stepped_batch, self._owed_batch_end, self._owed_epoch_end = None, [], []
        self._roster.stops.pending.clear()  # as a new Trainer's should_stop: a request left by an earlier fit is gone
        self._slots.book.resume_epoch(self.current_epoch, self._group.trial_ids)
        self._forward_hook("on_train_start")

    @override
    def on_train_epoch_start(self) -> None:
        self._optimizers.forget_left(tid for tid, _ in self._owed_epoch_end)  # (none: an epoch's end runs them)
        self._epoch_open, self._owed_epoch_end = True, []
        self._slots.book.start_epoch(self._group.trial_ids, self.current_epoch)
        self._forward_hook("on_train_epoch_start")
        # compile=: may a steady step run as one compiled function under this trainer? (step/whole_step.py)
        self._training_step.whole.configure(self.trainer, self._batch_hooks.overridden)

    @override
    def on_train_epoch_end(self) -> None:
        self.read_health()  # a loader of unknown length has no recognisable last batch
        self._forward_hook("on_train_epoch_end")
        if self._owed_epoch_end:  # trials a callback stopped within this epoch
            owed, self._owed_epoch_end = self._owed_epoch_end, []
            forward_hook("on_train_epoch_end", owed, self._metrics)
            self._optimizers.forget_left(tid for tid, _ in owed)
        self._epoch_open = False
        self._publisher.end_training_epoch(self.current_epoch, self.log, sanity_checking=self.trainer.sanity_checking)
        self._stop_requested_trials()
        self._end_fit_if_empty()

    @override
    def on_train_end(self) -> None:
        self.read_health()
        self._forward_hook("on_train_end")

    @override
    def on_fit_end(self) -> None:
        self._ranks.fit_ended()
        self._forward_hook("on_fit_end")
        if not self.trainer.interrupted:
            self._slots.book.set_status(self._group.trial_ids, "completed")
        if self.summary and self.trainer.is_global_zero:
            # plain stdout (the progress bar is finished): Lightning's print goes through the bar, to stderr
            print(format_results_table(self._slots.book.records, monitor=self.monitor, mode=self.mode))
        self._publish_chosen_trial("fit")
        if self._policy.compile:
            rank_zero_info(f"FusedLightningModule: {self.compile_report}.")

    def _publish_chosen_trial(self, stage: str) -> None:
        # after Lightning's own updates of the stage's metrics: see TrialPublisher.publish_chosen_trial
        self._publisher.publish_chosen_trial(self.trainer, monitor=self.monitor, mode=self.mode, stage=stage)

    # -- checkpoints ---------------------------------------------------------------------------------------------

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Lightning has taken the state dict already: the rows stay; what the device holds is read back (one sync)
        epoch_done = self._open_batch is not None and self._open_batch + 1 >= self.trainer.num_training_batches
        entry = group_state(self._slots, self._policy, self._health.peek(), epoch_done=epoch_done)
        entry[ENTRIES_KEY] = save_trial_entries(checkpoint, recorded_trials(self._slots))
        checkpoint[CHECKPOINT_KEY] = entry

    @classmethod
    def load_group_checkpoint(
        cls,
        path: Any,
        *,
        trial_factory: Callable[[int], L.LightningModule | None] | None = None,
        map_location: Any = None,
        weights_only: bool | None = None,
        **kwargs: Any,
    ) -> FusedLightningModule:
        """The fused group a group checkpoint holds, built without a Trainer: every trial, running or ended.

        A group checkpoint is what ``trainer.save_checkpoint`` writes for a fused group, and what a per-trial
        ``ModelCheckpoint`` writes directly into its ``dirpath`` (``trainer.checkpoint_callback.group_model_path``,
        ``last.ckpt``); a trial's own checkpoints (``{dirpath}/trial_{id}/``) load into the trial's class instead.
        Trials are rebuilt by ``trial_factory(id)`` or as ``class(**hparams)``; then ``unfuse(id)`` gives each
        trial's module, and ``trainer.test(fused)`` evaluates every trial.

        Args:
            path: the group checkpoint.
            trial_factory: builds a trial id's module (needed where the class saved too few hyperparameters to be
                rebuilt, e.g. lightning-hydra-template's ``save_hyperparameters(ignore=["net"])``).
            map_location: as for ``torch.load``.
            weights_only: as for ``torch.load`` (``False`` for hyperparameters such as ``functools.partial``).
            **kwargs: the rest of ``FusedLightningModule``'s arguments (``backend``, ``summary``, ...).

        Raises:
            ValueError: ``path`` is not a group checkpoint.
        """
        return load_group_checkpoint(
            cls, path, trial_factory=trial_factory, map_location=map_location, weights_only=weights_only, **kwargs
        )

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        fitting = self._trainer is None or self.trainer.state.fn == TrainerFn.FITTING
        group = group_checkpoint_for_trial(checkpoint, self._trainer, fitting=fitting)
        if group is not None:  # Lightning loads what this dict holds after this hook: the group's state
            checkpoint.clear()
            checkpoint.update(group)
        self._diverged_on_resume = restore_group(
            checkpoint, self._slots, self._policy, self.trial_factory, fitting=fitting
        )
        self._health.reset()
        if self._trainer is not None:
            stops = self._roster.stops if fitting else None
            for tid, module in [*self._running(), *self._slots.retired.items()]:
                attach_trainer(module, self.trainer, tid, self._optimizers, stops)  # type: ignore[arg-type]
        # after the trainer is attached: the trials' hooks see it as alone (Lightning loads the weights next)
        load_trial_entries(checkpoint, checkpoint[CHECKPOINT_KEY].get(ENTRIES_KEY), recorded_trials(self._slots))


def _hand_back_group(module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
    """State-dict hook: a ``ddp_spawn`` worker's state dict carries the group's state back (see rank_sync.py)."""
    assert isinstance(module, FusedLightningModule)
    fused = module
    fused._ranks.hand_back(
        state_dict,
        prefix,
        lambda: group_state(fused._slots, fused._policy, fused._health.peek(), epoch_done=False),
    )


def _take_back_group(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """Load pre-hook: the group's state a ``ddp_spawn`` worker handed back is restored before its weights load."""
    assert isinstance(module, FusedLightningModule)
    entry = RankSync.take_back(state_dict, prefix)
    if entry is not None:
        checkpoint = {CHECKPOINT_KEY: entry, "state_dict": state_dict}
        restore_group(checkpoint, module._slots, module._policy, module.trial_factory, fitting=False)
        module._health.reset()
