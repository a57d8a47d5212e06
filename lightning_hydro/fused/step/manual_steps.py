"""``ManualSteps``: a fused group of trials that use manual optimization, each trial's step run as it runs alone.

Under manual optimization (``automatic_optimization = False``: a GAN's two optimizers, a custom update) the
user's ``training_step`` does the optimization itself: ``opt_g, opt_d = self.optimizers()``,
``self.toggle_optimizer(opt_g)``, ``self.manual_backward(loss)``, ``self.clip_gradients(opt_g, ...)``,
``opt_g.step()``, ``opt_g.zero_grad()``, ``sch = self.lr_schedulers(); sch.step()``. A fused group runs that step
for each trial in turn on the trial's own module (the loop backend), whose parameters and buffers are bound to
its rows of the stacked state: its forward, ``manual_backward`` and optimizer steps are those of the trial trained
alone, on the same numbers, and an optimizer step writes the trial's rows in place. Lightning's accessors answer
per trial (:mod:`lightning_hydro.fused.lightning.trainer_view`, :mod:`lightning_hydro.fused.lightning.strategy_view`):
the trial's own optimizers, wrapped as Lightning wraps them, its own schedulers, and Lightning's precision plugin for
its backward and steps, its hooks included.

Isolation: a trial whose ``manual_backward`` gets a non-finite loss, or whose optimizer is asked to step with
non-finite gradients, is marked diverged; none of its optimizer steps runs from then on (its last finite weights
are kept), and its slot is freed when the group's health is read back (:mod:`.row_health`). Checking the
gradients before a step reads one value back from the device per step (a host sync; the loop runs one trial
after another anyway). The other trials are untouched: each runs its own code on its own rows.

Lightning counts a manual run's ``global_step`` as its optimizer steps; the group's advances by the most steps
any trial took in the batch (a GAN's two optimizers: two per batch, as for each trial alone).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature
from torch import Tensor
from torch.optim import Optimizer

from lightning_hydro.backends import Backend, StepOutputs
from lightning_hydro.backends.auto import AutoChoice
from lightning_hydro.backends.base import stack_logs
from lightning_hydro.backends.batch_copies import BatchRuns
from lightning_hydro.backends.trial_logging import LogCall, capture_logs
from lightning_hydro.fused.group.slots import TrialSlots
from lightning_hydro.fused.step.row_health import RowHealth
from lightning_hydro.optim.group_optimizer import StepReport

if TYPE_CHECKING:
    from lightning_hydro.stacking.stacked_state import StackedState

__all__ = ["MANUAL_BACKEND_REASON", "ManualStepResult", "ManualSteps", "choose_loop_for_manual"]

MANUAL_BACKEND_REASON = (
    "the trials use manual optimization (automatic_optimization = False): their training_step calls "
    "manual_backward and opt.step() itself, which runs per trial only on 'loop' (each trial's step in turn, with "
    "its own optimizers); under vmap or hfta one call runs every trial's step at once, and a backward or an "
    "optimizer step cannot run inside it"
)


class _SkipStep(Exception):
    """Raised inside an optimizer's closure to stop a diverged trial's step before the optimizer updates anything."""


@dataclass
class ManualStepResult:
    """One fused manual step: what the trials logged, their health as a report, and Lightning's step count."""

    outputs: StepOutputs
    report: StepReport
    steps: int


class ManualSteps:
    """Runs each running trial's own ``training_step`` in turn, guarding its backward and optimizer steps.

    Args:
        slots: the group's slots (the running trials and their bound modules).
        health: the rows' health: trials found diverged but not yet read back do not step.
    """

    def __init__(self, slots: TrialSlots, health: RowHealth) -> None:
        self.slots = slots
        self.health = health
        self.active = False
        self._attempts: dict[int, int] = {}
        self._bad: dict[int, str] = {}  # trial id -> why its steps are skipped (this batch, or not yet read back)

    def run(self, batch: Any, batch_idx: int) -> ManualStepResult:
        """Every running trial's ``training_step(batch, batch_idx)``, one after another."""
        ids = list(self.slots.trial_ids)
        pending = self.health.rows_to_skip(ids)
        self._bad = {} if pending is None else {tid: "earlier" for tid, bad in zip(ids, pending.tolist()) if bad}
        self._attempts = dict.fromkeys(ids, 0)
        outputs: list[Any] = []
        calls_per_row: list[list[LogCall]] = []
        runs = BatchRuns(batch, len(ids))  # each trial's step gets the batch as the loader gave it
        batches: list[Any] = []  # and as its step left it, for its batch-end hooks
        self.active = True
        try:
            for _tid, module in self.slots.running():
                step: Callable[..., Any] = module.training_step  # type: ignore[assignment]
                batches.append(runs.next())
                # as Lightning calls it: training_step(batch) where the step takes no batch_idx
                with_index = is_param_in_hook_signature(step, "batch_idx", min_args=2)
                args = (batches[-1], batch_idx) if with_index else (batches[-1],)
                with capture_logs(module) as calls:
                    outputs.append(step(*args))
                calls_per_row.append(calls)
        finally:
            self.active = False
        self.slots.group.adopt_reassigned_buffers()  # what their code reassigned goes into their rows
        device = self.slots.group.device
        # a trial found bad in an earlier batch (not yet read back) counts as skipped; its first reason stays
        by_loss = torch.tensor([self._bad.get(tid) in ("non-finite loss", "earlier") for tid in ids], device=device)
        by_grads = torch.tensor([self._bad.get(tid) == "non-finite gradients" for tid in ids], device=device)
        return ManualStepResult(
            outputs=StepOutputs(output=None, logs=stack_logs(calls_per_row, device), per_row=outputs, batches=batches),
            report=StepReport(tuple(ids), by_loss, by_grads, on_host=True),
            steps=max(self._attempts.values(), default=0),
        )

    def _mark(self, trial_id: int, reason: str) -> None:
        self._bad.setdefault(trial_id, reason)

    def check_loss(self, trial_id: int, loss: Tensor) -> None:
        """``manual_backward(loss)`` of a trial: a non-finite loss marks it diverged (no more steps)."""
        if self.active and not bool(torch.isfinite(loss.detach()).all()):
            self._mark(trial_id, "non-finite loss")

    def optimizer_step(
        self,
        trial_id: int,
        optimizer: Optimizer,
        closure: Callable[[], Any],
        step: Callable[[Callable[[], Any]], Any],
    ) -> Any:
        """``opt.step(closure)`` of a trial: ``step(guarded_closure)`` runs Lightning's optimizer step.

        The guarded closure runs the trial's closure, then refuses to let the optimizer update a trial marked
        diverged or whose gradients are not finite (torch optimizers run the closure before they update).
        """
        if not self.active:
            return step(closure)
        self._attempts[trial_id] = self._attempts.get(trial_id, 0) + 1

        def guarded() -> Any:
            result = closure()
            if trial_id not in self._bad and not _finite_gradients(optimizer):
                self._mark(trial_id, "non-finite gradients")
            if trial_id in self._bad:
                raise _SkipStep
            return result

        try:
            return step(guarded)
        except _SkipStep:
            return None


def _finite_gradients(optimizer: Optimizer) -> bool:
    grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    if not grads:
        return True
    return bool(torch.stack([torch.isfinite(g).all() for g in grads]).all())


@dataclass
class _ManualChoice(AutoChoice):
    """``backend="auto"``'s choice for trials that use manual optimization: the loop, and why."""

    def describe(self) -> str:
        return f"backend='auto' chose 'loop' without timing: {MANUAL_BACKEND_REASON}"


def choose_loop_for_manual(
    group: StackedState, candidates: Sequence[tuple[str, Callable[[], Backend]]], run_step: Any, **_: Any
) -> AutoChoice:
    """The chooser ``backend="auto"`` uses for manual optimization: the loop, untimed (the reason is logged)."""
    return _ManualChoice(dict(candidates)["loop"](), timed=False)
