"""``TrialOptimizers``: a fused group's per-trial optimizers, LR schedulers and clipping, as Lightning sees them.

Lightning asks a LightningModule once for its optimizers and LR scheduler configs, and keeps the configs in its
strategy. For a fused group the answer is one :class:`~lightning_hydro.optim.group_optimizer.TrialGroupOptimizer`
built from each trial's own ``configure_optimizers`` and one scheduler config per trial scheduler (names and
monitored keys get ``/trial_{id}``: :func:`scheduler_configs`). When trials join or leave, their scheduler
configs join or leave Lightning's list here; gradients are clipped per trial (:func:`clip_trial_gradients`).
Trials that use manual optimization get a :class:`~lightning_hydro.optim.manual_group_optimizer.ManualGroupOptimizer`
(their steps step their own optimizers, and their schedulers are theirs to step: Lightning hands none of them
a config). Each trial's Trainer view asks here for the trial's own optimizers (:mod:`.lightning.strategy_view`).

Example::

    >>> from torch import nn
    >>> from lightning_hydro.demos import DigitsMLP
    >>> from lightning_hydro.fused.group.slots import TrialSlots
    >>> slots = TrialSlots(nn.Module(), [DigitsMLP(hidden_dim=8) for _ in range(2)], [0, 1], max_slots=2)
    >>> optimizers, schedulers = TrialOptimizers(slots, path="universal").configure()
    >>> type(optimizers[0]).__name__, optimizers[0] is slots.optimizer, schedulers
    ('TrialGroupOptimizer', True, [])
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any

import lightning as L
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning.pytorch.utilities.types import LRSchedulerConfig

from lightning_hydro.backends.compiled_step import CompileSetting
from lightning_hydro.fused.group.slots import TrialSlots
from lightning_hydro.fused.step.compiled_update import CompiledUpdate
from lightning_hydro.fused.step.manual_steps import ManualSteps
from lightning_hydro.fused.step.select_update import select_fused_update
from lightning_hydro.optim.group_optimizer import OptimizerPath, TrialGroupOptimizer, TrialScheduler
from lightning_hydro.optim.manual_group_optimizer import ManualGroupOptimizer
from lightning_hydro.optim.optimizer_config import TrialOptimization, parse_optimizer_config
from lightning_hydro.stacking.stacked_state import StackedState

__all__ = ["TrialOptimizers", "clip_trial_gradients", "custom_clipping", "drop_scheduler_configs", "scheduler_configs"]


class TrialOptimizers:
    """Builds the group optimizer from each trial's ``configure_optimizers``; keeps Lightning's scheduler configs.

    Args:
        slots: the group's slots (the optimizer is kept there, so that stop and add update it in step).
        path: ``"auto"``, ``"universal"`` or ``"fused"`` (see ``FusedLightningModule(optimizer_path=...)``).
        manual_steps: for trials that use manual optimization, the guard of their steps.
        compile: the fused module's ``compile=``: the fused update runs under torch.compile too.
    """

    def __init__(
        self,
        slots: TrialSlots,
        path: OptimizerPath,
        manual_steps: ManualSteps | None = None,
        *,
        compile: CompileSetting = False,
    ) -> None:
        self.slots = slots
        self.path: OptimizerPath = path
        self._manual_steps = manual_steps
        self.compile: CompileSetting = compile
        # the group's compiled update, shared by the updates rebuilt at its slot changes (one cache per group)
        self._compiled_update = CompiledUpdate(compile) if compile else None
        self._leaving: dict[int, TrialOptimization] = {}  # trials that left with hooks still to run (see optimization)

    @property
    def compiled_update_failure(self) -> str:
        """Why the group's compiled optimizer update runs eagerly (empty while compiled, or with compile off)."""
        return "" if self._compiled_update is None else self._compiled_update.failure

    @property
    def manual_steps(self) -> ManualSteps | None:
        """The guard of the trials' own steps under manual optimization (None: automatic optimization)."""
        return self._manual_steps

    def optimization(self, trial_id: int) -> TrialOptimization | None:
        """The trial's own optimizers and schedulers (None before Lightning asked, or once the trial left).

        A trial that left but still has hooks to run (:meth:`keep_while_leaving`) keeps them until
        :meth:`forget_left`.
        """
        current = None if self.optimizer is None else self.optimizer.trials.get(trial_id)
        return current if current is not None else self._leaving.get(trial_id)

    def keep_while_leaving(self, trial_id: int) -> None:
        """Keep the trial's optimizers and schedulers for its own hooks that run after it left (a callback's stop)."""
        optimization = self.optimization(trial_id)
        if optimization is not None:
            self._leaving[trial_id] = optimization

    def forget_left(self, trial_ids: Iterable[int]) -> None:
        """The left trials' hooks have run: let go of their optimizers (and their state) as of any trial that left."""
        for trial_id in trial_ids:
            self._leaving.pop(trial_id, None)

    def group_size(self) -> int:
        """How many trials the group runs now."""
        return self.slots.group.size

    @property
    def optimizer(self) -> TrialGroupOptimizer | None:
        """The group optimizer (None until Lightning has asked for it)."""
        return self.slots.optimizer

    def configure(self) -> tuple[list[TrialGroupOptimizer], list[dict[str, Any]]]:
        """What ``configure_optimizers`` returns: the group optimizer, and every running trial's scheduler configs."""
        trials = {tid: self.trial_optimization(tid, module) for tid, module in self.slots.running()}
        optimizer: TrialGroupOptimizer
        if self._manual_steps is not None:
            optimizer = ManualGroupOptimizer(self.slots.group, trials)
        else:
            fast_path = partial(select_fused_update, compile=self._compiled_update or False)
            optimizer = TrialGroupOptimizer(
                self.slots.group, trials, path=self.path, fast_path=fast_path, clipping=self
            )
        self.slots.use_optimizer(optimizer)  # the slots keep it in step with stop and add
        configs = [config for tid in self.slots.trial_ids for config in self.scheduler_configs(tid)]
        return [optimizer], [vars(c).copy() for c in configs]

    def checkpoint_states(
        self, trial_id: int, clone: Callable[[Any], Any]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        """Copies of the trial's optimizer and LR scheduler states, for its own checkpoint (None: it has none).

        None before Lightning asked for optimizers and once the trial left its slot. The fused fast path keeps the
        optimizer state stacked: it is written into the trial's own optimizer, copied (``clone``: the optimizer
        states; the schedulers' are deep copies), and stacked again.
        """
        optimizer = self.optimizer
        optimization = None if optimizer is None else optimizer.trials.get(trial_id)
        if optimizer is None or optimization is None:
            return None
        optimizer.materialize()
        optimizers = [clone(o.state_dict()) for o in optimization.optimizers]
        schedulers = [copy.deepcopy(spec.scheduler.state_dict()) for spec in optimization.schedulers]
        optimizer.rebuild()
        return optimizers, schedulers

    def trial_optimization(self, trial_id: int, module: Any) -> TrialOptimization:
        """The trial's own ``configure_optimizers()`` output, parsed."""
        manual = self._manual_steps is not None
        return parse_optimizer_config(module.configure_optimizers(), trial_id=trial_id, module=module, manual=manual)

    def scheduler_configs(self, trial_id: int) -> list[LRSchedulerConfig]:
        """Lightning's configs for the trial's schedulers (none before the optimizer exists).

        Under manual optimization Lightning steps no scheduler (the trial's step does: ``self.lr_schedulers()``
        answers with its own), so it gets none.
        """
        if self.optimizer is None or self._manual_steps is not None:
            return []
        return scheduler_configs(self.optimizer, trial_id)

    def trial_added(self, trainer: L.Trainer | None, trial_id: int) -> None:
        """Lightning steps the newcomer's schedulers from now on."""
        if trainer is not None and self.optimizer is not None:
            trainer.strategy.lr_scheduler_configs.extend(self.scheduler_configs(trial_id))

    def trial_removed(self, trainer: L.Trainer | None, trial_id: int) -> None:
        """Lightning no longer steps a stopped trial's schedulers."""
        if trainer is not None and self.optimizer is not None:
            drop_scheduler_configs(trainer.strategy.lr_scheduler_configs, trial_id)

    def overridden(self) -> bool:
        """Whether a running trial overrides ``configure_gradient_clipping`` (:func:`custom_clipping`)."""
        return custom_clipping(self.slots.group.modules)

    def clip(self, value: float | None, algorithm: Any) -> None:
        """Clip each trial's gradients by its own hook (:func:`clip_trial_gradients`); the group optimizer asks.

        On the fused path, when no trial clips its own way, the group optimizer clips every row in one pass instead
        (:meth:`~lightning_hydro.optim.group_optimizer.TrialGroupOptimizer.clip_gradients`).
        """
        if self.optimizer is not None:
            clip_trial_gradients(self.slots.group, self.optimizer, value, algorithm, custom=self.optimizer.own_clipping)


# -- each trial's LR schedulers as Lightning scheduler configs (stepped by Lightning's own rules, per trial) --


def scheduler_configs(optimizer: TrialGroupOptimizer, trial_id: int) -> list[LRSchedulerConfig]:
    """Lightning configs for the trial's schedulers; names and monitored keys get ``/trial_{id}``."""
    configs = []
    for spec in optimizer.trials[trial_id].schedulers:
        configs.append(
            LRSchedulerConfig(
                scheduler=TrialScheduler(optimizer, trial_id, spec.scheduler),  # type: ignore[arg-type]
                name=None if spec.name is None else f"{spec.name}/trial_{trial_id}",
                interval=spec.interval,
                frequency=spec.frequency,
                reduce_on_plateau=spec.reduce_on_plateau,
                monitor=None if spec.monitor is None else f"{spec.monitor}/trial_{trial_id}",
                strict=spec.strict,
            )
        )
    return configs


def drop_scheduler_configs(configs: list[LRSchedulerConfig], trial_id: int) -> None:
    """Remove, in place, the configs of a trial that left the group."""
    configs[:] = [c for c in configs if getattr(c.scheduler, "trial_id", None) != trial_id]


# -- gradient clipping: each trial clipped as Lightning clips it when it trains alone -------------------------
#
# Lightning clips in the LightningModule's ``configure_gradient_clipping(optimizer, val, algorithm)`` hook,
# whose default calls ``clip_gradients``, which hands the optimizer's parameters (param-group order) to the
# precision plugin and so to ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_``. A fused group calls
# that same hook of every trial module with the trial's own optimizer, its parameters' ``.grad`` being views of
# their rows of the stacked gradients: the arithmetic is Lightning's and torch's own, on the same numbers, so
# on the loop backend with the universal optimizer path a clipped step is bitwise that of a separate run, and a
# trial that overrides the hook (its own clipping rule) keeps it.
#
# On the fused optimizer path, when no trial overrides the hook, the group optimizer clips the rows in one pass
# over the stacked gradients instead (``FusedUpdate.clip_norm``): the same formula, summed in another order
# (float rounding).


def custom_clipping(modules: Sequence[Any]) -> bool:
    """Whether a trial module overrides ``configure_gradient_clipping`` (its own rule runs then, per trial)."""
    return any(is_overridden("configure_gradient_clipping", m, L.LightningModule) for m in modules)


def clip_trial_gradients(
    group: StackedState,
    optimizer: TrialGroupOptimizer,
    gradient_clip_val: float | None,
    gradient_clip_algorithm: Any,
    *,
    custom: bool | None = None,
) -> None:
    """Clip each live trial's gradients as its own ``configure_gradient_clipping`` hook does.

    Args:
        group: the stacked state (its parameters hold the fused backward's gradients).
        optimizer: the group optimizer, holding each trial's own optimizer.
        gradient_clip_val: ``Trainer(gradient_clip_val=...)`` (None or 0: no clipping unless a trial's hook
            clips by itself).
        gradient_clip_algorithm: ``Trainer(gradient_clip_algorithm=...)``, passed on as Lightning passes it.
        custom: whether a trial overrides ``configure_gradient_clipping`` (:func:`custom_clipping`; None: look).
    """
    if custom is None:
        custom = custom_clipping(group.modules)
    if not custom and not gradient_clip_val:
        return
    trials = list(zip(group.trial_ids, group.modules))
    group.distribute_grads()
    for tid, module in trials:
        module.configure_gradient_clipping(  # type: ignore[operator]
            optimizer.trials[tid].optimizer,
            gradient_clip_val=gradient_clip_val,
            gradient_clip_algorithm=gradient_clip_algorithm,
        )
    if optimizer.active_path == "fused":
        group.clear_trial_grads()  # the fused update reads the stacked gradients; drop the views
