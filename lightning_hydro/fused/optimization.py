"""``TrialOptimizers``: a fused group's per-trial optimizers and LR schedulers, as Lightning sees them.

Lightning asks a LightningModule once for its optimizers and LR scheduler configs, and keeps the configs in its
strategy. For a fused group the answer is one :class:`~lightning_hydro.optim.group_optimizer.TrialGroupOptimizer`
built from each trial's own ``configure_optimizers`` and one scheduler config per trial scheduler (names and
monitored keys get ``/trial_{id}``: see :mod:`.trial_schedulers`). When trials join or leave, their scheduler
configs join or leave Lightning's list here; gradients are clipped per trial (see :mod:`.trial_clipping`).
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

from functools import partial
from typing import Any

import lightning as L
from lightning.pytorch.utilities.types import LRSchedulerConfig

from lightning_hydro.backends.compiled_step import CompileSetting
from lightning_hydro.fused.group.slots import TrialSlots
from lightning_hydro.fused.step.fused_path import select_fused_path
from lightning_hydro.fused.step.manual_steps import ManualSteps
from lightning_hydro.fused.trial_clipping import clip_trial_gradients, custom_clipping
from lightning_hydro.fused.trial_schedulers import drop_scheduler_configs, scheduler_configs
from lightning_hydro.optim.group_optimizer import OptimizerPath, TrialGroupOptimizer
from lightning_hydro.optim.manual_group_optimizer import ManualGroupOptimizer
from lightning_hydro.optim.optimizer_config import TrialOptimization, parse_optimizer_config

__all__ = ["TrialOptimizers"]


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
        self._custom: tuple[tuple[int, ...], bool] | None = None  # (trial ids, whether one clips its own way)

    @property
    def manual_steps(self) -> ManualSteps | None:
        """The guard of the trials' own steps under manual optimization (None: automatic optimization)."""
        return self._manual_steps

    def optimization(self, trial_id: int) -> TrialOptimization | None:
        """The trial's own optimizers and schedulers (None before Lightning asked, or once the trial left)."""
        return None if self.optimizer is None else self.optimizer.trials.get(trial_id)

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
        if self._manual_steps is not None:
            self.slots.optimizer = ManualGroupOptimizer(self.slots.group, trials)
        else:
            fast_path = partial(select_fused_path, compile=self.compile)
            self.slots.optimizer = TrialGroupOptimizer(self.slots.group, trials, path=self.path, fast_path=fast_path)
        configs = [config for tid in self.slots.trial_ids for config in self.scheduler_configs(tid)]
        return [self.slots.optimizer], [vars(c).copy() for c in configs]

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

    def clip(self, value: float | None, algorithm: str | None) -> None:
        """Clip each trial's gradients as Lightning clips one module's (see :mod:`.trial_clipping`)."""
        if self.optimizer is None:
            return
        group = self.slots.group
        ids = tuple(group.trial_ids)
        if self._custom is None or self._custom[0] != ids:  # asked every step; answered once per set of trials
            self._custom = (ids, custom_clipping(group.modules))
        clip_trial_gradients(group, self.optimizer, value, algorithm, custom=self._custom[1])
