"""One torch optimizer, as Lightning sees it, that steps every trial of a fused group with its own optimizer.

Lightning's automatic optimization drives one optimizer: it runs the closure (forward, backward,
gradient clipping), then calls ``step``. :class:`TrialGroupOptimizer` is that optimizer. After the closure
it checks each trial for non-finite losses or gradients (such a trial is reported as diverged and not
stepped), then updates the healthy trials either

- on the *universal* path: each trial parameter's ``.grad`` becomes the view ``stacked.grad[row]`` and the
  trial's own optimizer steps, whatever its class; or
- on the *fused* path (:mod:`.fused_update`): one vectorised SGD/Adam/AdamW update of the stacked tensors.

Its ``state_dict`` holds every trial's optimizer and scheduler state in torch's own per-trial format,
keyed by trial id, whichever path produced it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn
from torch.optim import Optimizer
from typing_extensions import override

from lightning_hydro.optim.fused_update import FusedUpdate, select_fused_update
from lightning_hydro.optim.trial_optimization import TrialOptimization

if TYPE_CHECKING:
    from lightning_hydro.stacking.stacked_state import StackedState

__all__ = ["OptimizerPath", "StepReport", "TrialGroupOptimizer", "TrialScheduler"]

OptimizerPath = Literal["auto", "universal", "fused"]


@dataclass
class StepReport:
    """What the last ``step`` did: which trials were updated and which diverged (with the reason)."""

    stepped: list[int] = field(default_factory=list)
    diverged: dict[int, str] = field(default_factory=dict)


class TrialScheduler:
    """Stands in, for Lightning, for one trial's LR scheduler; Lightning's stepping rules stay in force.

    Lightning applies ``interval``/``frequency``/``monitor`` per scheduler config and then calls the
    LightningModule's ``lr_scheduler_step(scheduler, metric)``, where the fused module steps the real
    scheduler if its trial is still running. The real state is checkpointed by :class:`TrialGroupOptimizer`.
    """

    def __init__(self, optimizer: TrialGroupOptimizer, trial_id: int, scheduler: Any) -> None:
        self.optimizer = optimizer  # Lightning checks that a scheduler's optimizer was returned to it
        self.trial_id = trial_id
        self.scheduler = scheduler

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Step the real scheduler, unless its trial has left the group."""
        if self.trial_id in self.optimizer.trials:
            self.scheduler.step(*args, **kwargs)

    def state_dict(self) -> dict[str, Any]:
        """Only the trial id: the scheduler's state is saved with the group optimizer's."""
        return {"trial_id": self.trial_id}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """No-op: the scheduler's real state comes back with :meth:`TrialGroupOptimizer.load_state_dict`."""


def _record_step(optimizer: Optimizer) -> None:
    """Tell the trial's LR schedulers that the fused update stepped its optimizer in place of ``step()``.

    torch's ``LRScheduler`` wraps ``optimizer.step`` with a function that sets ``optimizer._opt_called``,
    and its first ``step()`` warns that the first value of the schedule is skipped when that flag is unset.
    The fused path updates the trial's parameters without calling ``step()``, so it sets the flag as the
    wrapper would: the warning keeps firing where it is true (a scheduler stepped before any update).
    """
    if hasattr(optimizer.step, "_wrapped_by_lr_sched"):
        optimizer._opt_called = True  # type: ignore[attr-defined]


class TrialGroupOptimizer(Optimizer):
    """Steps B trials' own optimizers (or one fused update) after one fused forward/backward.

    Args:
        group: the stacked state of the group (rows = live trials).
        trials: each live trial's optimizer and schedulers, by trial id.
        path: ``"auto"`` (fused where possible), ``"universal"`` or ``"fused"`` (error where impossible).
        is_skipped: returns the trials whose loss was non-finite this step (they are not stepped).
    """

    def __init__(
        self,
        group: StackedState,
        trials: Mapping[int, TrialOptimization],
        *,
        path: OptimizerPath = "auto",
        is_skipped: Callable[[], Mapping[int, str]] = dict,
    ) -> None:
        super().__init__(list(group.params.values()), defaults={})
        self.group = group
        self.trials: dict[int, TrialOptimization] = dict(trials)
        self.path: OptimizerPath = path
        self.fused: FusedUpdate | None = None
        self.fused_unavailable = ""
        self.last_report = StepReport()
        self._is_skipped = is_skipped
        self.rebuild()

    # -- path selection and state movement ---------------------------------------------------------------

    def _trial_params(self, tid: int) -> list[nn.Parameter]:
        module = self.group.modules[self.group.row_of(tid)]
        return [module.get_parameter(name) for name in self.group.params]

    def materialize(self) -> None:
        """Move fused state into the trials' own optimizers (before the rows change, or to checkpoint)."""
        if self.fused is None:
            return
        for row, tid in enumerate(self.group.trial_ids):
            optimizer = self.trials[tid].optimizer
            for param, state in zip(self._trial_params(tid), self.fused.export_row(row)):
                if state:
                    optimizer.state[param] = state
        self.fused = None

    def rebuild(self) -> None:
        """Choose the path for the current rows; on the fused path, take the trials' state into it."""
        self.materialize()
        if self.path == "universal" or not self.trials:
            return
        ids = self.group.trial_ids
        candidate = select_fused_update(
            [self.trials[tid].optimizer for tid in ids],
            [self._trial_params(tid) for tid in ids],
            list(self.group.params.values()),
        )
        if isinstance(candidate, str):
            if self.path == "fused":
                raise ValueError(
                    f"FusedLightningModule(optimizer_path='fused'): the fused optimizer path is unavailable "
                    f"because {candidate}; use optimizer_path='auto' or 'universal'."
                )
            self.fused_unavailable = candidate
            return
        for row, tid in enumerate(ids):
            optimizer = self.trials[tid].optimizer
            candidate.import_row(row, [dict(optimizer.state.get(p, {})) for p in self._trial_params(tid)])
            optimizer.state.clear()
        self.fused = candidate
        self.fused_unavailable = ""

    @property
    def active_path(self) -> Literal["universal", "fused"]:
        """The path the next step takes."""
        return "universal" if self.fused is None else "fused"

    # -- torch.optim.Optimizer API -------------------------------------------------------------------------

    @override
    def zero_grad(self, set_to_none: bool = True) -> None:
        for param in self.group.params.values():
            if set_to_none:
                param.grad = None
            elif param.grad is not None:
                param.grad.zero_()
        if self.fused is None:
            self.group.clear_trial_grads()

    def _unhealthy_rows(self) -> dict[int, str]:
        """Rows whose loss (reported by the module) or gradients are not finite, with the reason."""
        bad: dict[int, str] = {}
        skipped = self._is_skipped()
        grads = [p.grad for p in self.group.params.values() if p.grad is not None]
        if grads:
            # one reduction per parameter: a NaN or inf anywhere in a row makes that row's sum non-finite
            sums = torch.stack([g.flatten(1).sum(1) for g in grads]).sum(0)  # (an overflow to inf counts too)
            finite = torch.isfinite(sums).tolist()
        else:
            finite = [True] * self.group.size
        for row, tid in enumerate(self.group.trial_ids):
            if tid in skipped:
                bad[row] = skipped[tid]
            elif not finite[row]:
                bad[row] = "non-finite gradients"
        return bad

    @override
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.last_report = report = StepReport()
        if all(p.grad is None for p in self.group.params.values()):
            return loss  # the step returned None: nothing to update, as for any torch optimizer
        bad = self._unhealthy_rows()
        ids = self.group.trial_ids
        report.diverged = {ids[row]: reason for row, reason in bad.items()}
        if self.fused is not None:
            self.fused.step([self.trials[tid].optimizer.param_groups for tid in ids], skip_rows=sorted(bad))
            for row, tid in enumerate(ids):
                if row not in bad:
                    _record_step(self.trials[tid].optimizer)
        else:
            healthy = [row for row in range(len(ids)) if row not in bad]
            self.group.distribute_grads(healthy)
            for row in healthy:
                self.trials[ids[row]].optimizer.step()
        report.stepped = [tid for row, tid in enumerate(ids) if row not in bad]
        return loss

    @override
    def state_dict(self) -> dict[str, Any]:
        fused = self.fused is not None
        self.materialize()
        state = {
            "trials": {tid: t.optimizer.state_dict() for tid, t in self.trials.items()},
            "schedulers": {tid: [s.scheduler.state_dict() for s in t.schedulers] for tid, t in self.trials.items()},
        }
        if fused:
            self.rebuild()
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.materialize()
        missing = [tid for tid in self.trials if tid not in state_dict["trials"]]
        if missing:
            raise KeyError(f"The checkpoint has no optimizer state for trials {missing}.")
        for tid, trial in self.trials.items():
            trial.optimizer.load_state_dict(state_dict["trials"][tid])
            for spec, sched_state in zip(trial.schedulers, state_dict["schedulers"][tid]):
                spec.scheduler.load_state_dict(sched_state)
        self.rebuild()

    @override
    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if self.param_groups:  # only the constructor may add the stacked parameters
            raise RuntimeError("TrialGroupOptimizer manages its parameters itself; add trials to the group instead.")
        super().add_param_group(param_group)
