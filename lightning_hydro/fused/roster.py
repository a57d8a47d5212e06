"""``TrialRoster``: trials leave and join a running fused group here, and every part of the group hears of it.

A trial leaves by a decision (``stop_trial``) or by diverging; one joins into a free slot (``add_trial``). The
slots (:class:`~lightning_hydro.fused.group.slots.TrialSlots`) change the rows, the records and the optimizer
state as one operation; around it the roster keeps the rest of the group in step: the rows' health is read back
first (a trial found diverged leaves as such), the per-trial metrics and health re-slot, Lightning's LR scheduler
configs follow (:class:`~lightning_hydro.fused.optimization.TrialOptimizers`), and the backend policy hears
of the new group size. The rows' health is settled here too: when the health's schedule says so at a batch's end
(:meth:`~lightning_hydro.fused.step.row_health.RowHealth.end_batch`), it is read back, booking steps and stopping
diverged trials.

Leaving never ends the fit: the fused module does that from its own hooks once no trial runs, after the
callbacks of that hook have had their say (a callback may stop the last trial and refill its slot).
"""

from __future__ import annotations

from collections.abc import Callable

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from lightning_hydro.fused.evaluation.modes import TrialModes
from lightning_hydro.fused.lightning.trainer_view import TrialStopRequests, attach_trainer
from lightning_hydro.fused.logging.metrics import TrialMetrics
from lightning_hydro.fused.optimization import TrialOptimizers
from lightning_hydro.fused.step.backend_policy import BackendPolicy
from lightning_hydro.fused.step.row_health import HealthReadback, RowHealth
from lightning_hydro.stopping.trial_record import TrialStatus

__all__ = ["TrialRoster"]


class TrialRoster:
    """Stop and add trials of a fused group, and settle the rows' health, keeping every part in step.

    Args:
        policy: the group's backend policy (it holds the slots).
        optimizers: the group's optimizers as Lightning sees them.
        metrics: the per-trial metrics of the current step and epoch.
        health: the rows' health on the device.
        modes: the trial modules' train/eval modes around evaluation.
        on_rows_changed: called after every slot change (a DDP wrapper must then be rebuilt: see
            :mod:`.rank_sync`).
    """

    def __init__(
        self,
        policy: BackendPolicy,
        optimizers: TrialOptimizers,
        metrics: TrialMetrics,
        health: RowHealth,
        modes: TrialModes,
        on_rows_changed: Callable[[], None] | None = None,
    ) -> None:
        self.policy = policy
        self.on_rows_changed = on_rows_changed or (lambda: None)
        self.slots = policy.slots
        self.optimizers = optimizers
        self.metrics = metrics
        self.health = health
        self.modes = modes
        self.stops = TrialStopRequests()  # the trials' own hooks' trainer.should_stop (see trainer_view)

    # -- the rows' health ---------------------------------------------------------------------------------------

    def settle_health(self, trainer: L.Trainer | None, *, credit_epoch: bool) -> None:
        """Read the rows' health back (one sync): count steps, credit the epoch if asked, stop diverged trials."""
        readback = self.health.read() if self.health.pending else HealthReadback()
        book = self.slots.book
        for tid, steps in readback.steps.items():
            book.add_steps(tid, steps)
        now = trainer.global_step if trainer is not None else -1
        for late in (False, True):  # a trial that diverged in this very step trained through the batch
            if late and credit_epoch:
                book.count_epoch(self.slots.trial_ids)
            for tid, (reason, step) in readback.diverged.items():
                if (step >= now) == late:
                    rank_zero_info(f"FusedLightningModule: trial {tid} diverged at step {step} ({reason}); slot freed.")
                    self.stop(trainer, tid, reason, status="diverged")  # it records the trial's last step values

    # -- slot changes -------------------------------------------------------------------------------------------

    def stop(self, trainer: L.Trainer | None, trial_id: int, reason: str, *, status: TrialStatus) -> None:
        """Compact a running trial out of the group (see ``FusedLightningModule.stop_trial``)."""
        self.slots.check_stop(trial_id, status)  # before anything changes (the slots check again as they stop)
        # rows are about to change; a trial found diverged leaves as such
        self.settle_health(trainer, credit_epoch=False)
        if trial_id not in self.slots.trial_ids:
            return
        self.slots.book.update_metrics(trial_id, self.metrics.step_values().get(trial_id, {}))  # e.g. last train_loss
        self.metrics.reslot()
        self.slots.stop(trial_id, status, reason)
        self.health.reslot(self.slots.trial_ids)
        self.optimizers.trial_removed(trainer, trial_id)
        self.policy.trial_removed(trial_id)
        self.on_rows_changed()

    def add(self, trainer: L.Trainer | None, owner: nn.Module, module: L.LightningModule, trial_id: int | None) -> int:
        """Put a new trial into a free slot (see ``FusedLightningModule.add_trial``); returns its id."""
        if not isinstance(module, L.LightningModule):
            raise TypeError(f"add_trial: expected a lightning.LightningModule, got {type(module).__name__}.")
        self.slots.check_newcomer(module)  # before anything changes (the slots check again as they add)
        self.settle_health(trainer, credit_epoch=False)
        tid = self.slots.new_id(trial_id)
        if module.automatic_optimization != (self.optimizers.manual_steps is None):
            kinds = ("automatic", "manual") if module.automatic_optimization else ("manual", "automatic")
            raise ValueError(
                f"add_trial: the trial uses {kinds[0]} optimization and the group's trials {kinds[1]} optimization; a "
                "group runs one kind of training step. Add it to a group of its kind."
            )
        self.policy.check_newcomer(module, tid)
        module.to(device=self.slots.group.device)
        self.modes.set_newcomer(owner, module)
        self.metrics.reslot()
        if trainer is not None:
            attach_trainer(module, trainer, tid, self.optimizers, self.stops)
        optimization = None if self.optimizers.optimizer is None else self.optimizers.trial_optimization(tid, module)
        self.slots.add(module, tid, optimization)
        self.health.reslot(self.slots.trial_ids)
        self.optimizers.trial_added(trainer, tid)
        self.policy.trial_added(tid)
        self.on_rows_changed()
        return tid
