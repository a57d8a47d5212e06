"""One torch optimizer, as Lightning sees it, that steps every trial of a fused group with its own optimizer.

Lightning's automatic optimization drives one optimizer: it runs the closure (forward, backward,
gradient clipping), then calls ``step``. :class:`TrialGroupOptimizer` is that optimizer. After the closure
it checks each row for a non-finite loss (``skip``, given by the caller) or non-finite gradients (such a row
is not stepped), then updates the healthy rows either

- on the *universal* path: each trial parameter's ``.grad`` becomes the view ``stacked.grad[row]`` and the
  trial's own optimizer steps, whatever its class; or
- on the *fused* path (:mod:`.fused_update`): one vectorised SGD/Adam/AdamW update of the stacked tensors.

Its ``state_dict`` holds every trial's optimizer and scheduler state in torch's own per-trial format,
keyed by trial id, whichever path produced it.

The conversation is one-way: the fused module passes the rows to skip into :meth:`TrialGroupOptimizer.step`
and gets back a :class:`StepReport`; slot changes go through :meth:`TrialGroupOptimizer.add_trial` and
:meth:`TrialGroupOptimizer.remove_trial`. On the fused path nothing in ``step`` reads a value back to the host:
the skipped rows are a ``[B]`` mask on the device and the report holds device tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from typing_extensions import override

from lightning_hydro.optim.fused_update import FusedUpdate, SkipRows, select_fused_update
from lightning_hydro.optim.trial_optimization import TrialOptimization

if TYPE_CHECKING:
    from lightning_hydro.stacking.stacked_state import StackedState

__all__ = ["OptimizerPath", "RowsToSkip", "StepReport", "TrialGroupOptimizer", "TrialScheduler"]

OptimizerPath = Literal["auto", "universal", "fused"]


class RowsToSkip(Protocol):
    """The rows ``step`` must leave untouched, read after the closure ran (the closure runs ``training_step``)."""

    def rows_to_skip(self, trial_ids: list[int]) -> Tensor | None:
        """A ``[B]`` bool mask over the rows of ``trial_ids`` (True: do not step), or None: skip none."""

    def reads_each_step(self, device: torch.device) -> bool:
        """Whether the caller reads each step's report back at once (then the skipped rows are read here too)."""


@dataclass(frozen=True)
class StepReport:
    """What one ``step`` did, as ``[B]`` bool masks over the rows of ``trial_ids`` (on the group's device).

    ``skipped_loss``: rows skipped because the caller said so (a non-finite loss); ``skipped_gradients``: rows
    whose gradients were not finite. ``on_host`` is True where reading the masks costs no device sync (the
    universal path has read them already).
    """

    trial_ids: tuple[int, ...]
    skipped_loss: Tensor
    skipped_gradients: Tensor
    on_host: bool = False

    @property
    def skipped(self) -> Tensor:
        """Rows that were not stepped."""
        return self.skipped_loss | self.skipped_gradients

    def read(self) -> tuple[list[int], dict[int, str]]:
        """The stepped trials and the skipped ones with the reason (one device sync)."""
        loss, grads = torch.stack([self.skipped_loss, self.skipped_gradients]).tolist()
        stepped = [tid for tid, a, b in zip(self.trial_ids, loss, grads) if not (a or b)]
        skipped = {
            tid: "non-finite loss" if a else "non-finite gradients"
            for tid, a, b in zip(self.trial_ids, loss, grads)
            if a or b
        }
        return stepped, skipped


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
    """

    def __init__(
        self,
        group: StackedState,
        trials: Mapping[int, TrialOptimization],
        *,
        path: OptimizerPath = "auto",
    ) -> None:
        super().__init__(list(group.params.values()), defaults={})
        self.group = group
        self.trials: dict[int, TrialOptimization] = dict(trials)
        self.path: OptimizerPath = path
        self.fused: FusedUpdate | None = None
        self.fused_unavailable = ""
        self.rebuild()

    # -- slot changes (the rows of ``group`` change between materialize() and the call that follows) --------

    def remove_trial(self, trial_id: int) -> None:
        """The trial has left the group's rows: forget its optimizer; the others keep their state."""
        self.trials.pop(trial_id, None)
        self.rebuild()

    def add_trial(self, trial_id: int, optimization: TrialOptimization) -> None:
        """The trial has joined the group's rows with a fresh optimizer."""
        self.trials[trial_id] = optimization
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

    def _non_finite_gradients(self) -> Tensor:
        """``[B]`` bool: rows whose gradients hold a NaN or inf (stays on the device)."""
        grads = [p.grad for p in self.group.params.values() if p.grad is not None]
        if not grads:
            return torch.zeros(self.group.size, dtype=torch.bool, device=self.group.device)
        # one reduction per parameter: a NaN or inf anywhere in a row makes that row's sum non-finite
        sums = torch.stack([g.flatten(1).sum(1) for g in grads]).sum(0)  # (an overflow to inf counts too)
        return ~torch.isfinite(sums)

    @override
    def step(  # type: ignore[override]
        self, closure: Callable[[], Any] | None = None, *, skip: RowsToSkip | None = None
    ) -> StepReport | None:
        """Run the closure, then update every row that ``skip`` does not name and whose gradients are finite.

        Args:
            closure: Lightning's closure (forward, backward, clipping).
            skip: the rows not to step (a non-finite loss), read after the closure ran.

        Returns:
            What was stepped and skipped, or None if the closure produced no gradients (nothing updated).
        """
        if closure is not None:
            with torch.enable_grad():
                closure()
        if all(p.grad is None for p in self.group.params.values()):
            return None  # the step returned None: nothing to update, as for any torch optimizer
        ids = list(self.group.trial_ids)
        by_loss = None if skip is None else skip.rows_to_skip(ids)
        if by_loss is None:
            by_loss = torch.zeros(len(ids), dtype=torch.bool, device=self.group.device)
        by_grads = self._non_finite_gradients() & ~by_loss
        host = self.fused is None or (skip is not None and skip.reads_each_step(self.group.device))
        report = StepReport(tuple(ids), by_loss, by_grads, on_host=host)
        if self.fused is not None:
            rows: SkipRows = report.skipped  # a device mask: every row saved and selected (no host sync)
            if host:  # read anyway: save and restore only the skipped rows (cheaper than the masked path)
                rows = report.skipped.nonzero().flatten().tolist()
            self.fused.step([self.trials[tid].optimizer.param_groups for tid in ids], skip_rows=rows)
            for tid in ids:  # a skipped row leaves the group at the next read-back: its flag does not matter
                _record_step(self.trials[tid].optimizer)
            return report
        stepped, _ = report.read()  # the universal path steps trial by trial: it must know which on the host
        self.group.distribute_grads([self.group.row_of(tid) for tid in stepped])
        for tid in stepped:
            self.trials[tid].optimizer.step()
        return report

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
