"""The trials' own batch-level hooks, run per trial in a fused group as Lightning runs them for one module.

Lightning calls a LightningModule's batch-level hooks around every step: ``on_train_batch_start`` /
``on_train_batch_end``, ``on_before_backward``, ``on_after_backward``, ``on_before_optimizer_step``,
``on_before_zero_grad``, and the validation, test and predict batch hooks. In a fused group it calls them on the
fused module; each trial that overrides one gets it here, one trial after another, with its own share of what
Lightning passes: its row of the losses and of the step's outputs, its own optimizer, its parameters' gradients
(their rows of the stacked gradients, as views: a hook that changes them in place changes what the update uses),
and its own view of the Trainer. What a hook logs is booked as that trial's values, with Lightning's defaults for
the hook (``on_step`` for the training hooks, ``on_epoch`` for the evaluation ones).

Lightning's documented patterns run unchanged, e.g. logging gradient norms::

    def on_before_optimizer_step(self, optimizer):
        self.log_dict(grad_norm(self, norm_type=2))

The batch-end hooks (``on_train_batch_end``, ``on_validation_batch_end``, ...) get the batch as the trial's own step
left it, as alone: on the loop, where each trial's step runs on a batch of its own
(:class:`~lightning_hydro.backends.batch_copies.BatchRuns`), with what that step rebound (``batch[0] = ...``) and
wrote in place; under vmap and hfta, where one call runs every trial's step, the loader's batch, with the step's
in-place writes (the same in every trial there) but not its rebound entries (they hold vmap's tensors, which cannot
leave the call).

Hooks no trial overrides cost nothing: the fused module asks :attr:`TrialBatchHooks.overridden` first.
``on_train_batch_start`` returning -1 (skip the rest of the epoch) is honoured when every trial returns it; a
group cannot skip the epoch for some trials only, which raises with the remedy.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor, nn

from lightning_hydro.backends import StackedLog, StepOutputs
from lightning_hydro.backends.python_state import trial_code_ran
from lightning_hydro.backends.trial_logging import stack_values
from lightning_hydro.fused.group.slots import TrialSlots
from lightning_hydro.fused.lightning.hooks import call_trial_hook
from lightning_hydro.fused.logging.metrics import TrialMetrics, resolve_options

__all__ = ["BATCH_HOOKS", "TrialBatchHooks", "batch_of", "outputs_by_row"]

# The batch-level hooks a trial may override, and the phase its logged values belong to (None: not logged).
BATCH_HOOKS = {
    "on_train_batch_start": "train",
    "on_train_batch_end": "train",
    "on_before_backward": "train",
    "on_after_backward": "train",
    "on_before_optimizer_step": "train",
    "on_before_zero_grad": "train",
    "optimizer_step": "train",  # run by the fused module around its step (fused/lightning/trial_optimizer_steps.py)
    "on_validation_batch_start": "validate",
    "on_validation_batch_end": "validate",
    "on_test_batch_start": "test",
    "on_test_batch_end": "test",
    "on_predict_batch_start": None,
    "on_predict_batch_end": None,
}

# Hooks that see the trial's gradients: each trial parameter's ``.grad`` is its row of the stacked gradients.
_WITH_GRADIENTS = ("on_after_backward", "on_before_optimizer_step")


def outputs_by_row(out: StepOutputs, rows: int, *, training: bool) -> list[Any]:
    """Each row's share of a fused step's output, as Lightning hands the trial's own on to its batch-end hook.

    ``training``: a training step's, detached, a tensor as ``{"loss": ...}``; else as the step returned it.
    """
    if out.per_row is not None:
        per_row = list(out.per_row)
    elif isinstance(out.output, Tensor):
        per_row = [out.output[row] for row in range(rows)]
    elif isinstance(out.output, dict):
        per_row = [{k: v[row] for k, v in out.output.items()} for row in range(rows)]
    else:
        per_row = [None] * rows
    return [_as_training_output(value) for value in per_row] if training else per_row


def batch_of(out: StepOutputs | None, row: int, batch: Any) -> Any:
    """Row ``row``'s batch after the step, as its trial's batch-end hooks get it alone (see the module docstring)."""
    return batch if out is None else out.batch_of(row, batch)


def _as_training_output(value: Any) -> Any:
    if isinstance(value, Tensor):
        return {"loss": value.detach()}
    if isinstance(value, Mapping):
        return {k: v.detach() if isinstance(v, Tensor) else v for k, v in value.items()}
    return value


class TrialBatchHooks:
    """Runs the batch-level hooks the trials override, per trial (see the module docstring).

    Args:
        slots: the group's slots (the running trials and their rows).
        metrics: books what the hooks log per trial.
        optimizer_of: a trial id's own optimizer (None before Lightning asked for optimizers).
    """

    def __init__(
        self, slots: TrialSlots, metrics: TrialMetrics, optimizer_of: Callable[[int], torch.optim.Optimizer | None]
    ) -> None:
        self.slots = slots
        self.metrics = metrics
        self.optimizer_of = optimizer_of
        self.overridden: frozenset[str] = frozenset()
        self.refresh(slots.group.modules)

    def refresh(self, modules: Sequence[nn.Module]) -> None:
        """Which hooks some trial overrides (asked again when a trial joins)."""
        self.overridden = frozenset(
            hook for hook in BATCH_HOOKS for m in modules if is_overridden(hook, m, L.LightningModule)
        )

    # -- training ----------------------------------------------------------------------------------------------

    def train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        """Each trial's ``on_train_batch_start``: -1 from every trial skips the rest of the epoch.

        Raises:
            ValueError: some trials return -1 and others do not.
        """
        answers = self.run("on_train_batch_start", lambda tid, row: (batch, batch_idx), batch)
        skipping = [tid for tid, answer in answers.items() if answer == -1]
        if not skipping:
            return None
        if len(skipping) == len(answers):
            return -1
        raise ValueError(
            f"on_train_batch_start returned -1 (skip the rest of the epoch) for trials {skipping} only; a fused group "
            "trains its trials on the same batches, so it can skip the epoch for all of them or none. Return -1 "
            "from every trial, or stop a trial (FusedLightningModule.stop_trial) instead."
        )

    def train_output(self, out: StepOutputs | None, row: int, accumulate: int = 1) -> Any:
        """The share of a training step's outputs that row ``row``'s trial gets in its ``on_train_batch_end``."""
        output = None if out is None else outputs_by_row(out, self.slots.group.size, training=True)[row]
        return _normalized(output, accumulate) if accumulate > 1 else output

    def run_left(self, hook: str, calls: Sequence[tuple[int, nn.Module, tuple[Any, ...]]], batch: Any) -> None:
        """``hook`` of trials that have left the group, each ``(trial id, module, arguments)``: what it logs is theirs.

        A trial a callback stopped after the batch's step (alone: ``trainer.should_stop``, and Lightning still runs
        the module's ``on_train_batch_end`` after the callbacks') gets its own hook for that batch. Its epoch-level
        values count in its epoch's; a step-level value is not logged (the group's step values are its running
        trials').
        """
        trial_code_ran()
        logged: dict[str, tuple[list[int], list[Any], dict[str, Any]]] = {}
        for tid, module, arguments in calls:
            _, made = call_trial_hook(hook, tid, module, *arguments)
            for call in made:
                if not resolve_options(hook, call.options).on_epoch:
                    continue
                ids, values, _ = logged.setdefault(call.name, ([], [], {**call.options, "on_step": False}))
                ids.append(tid)
                values.append(call.value)
        self.record(hook, logged, batch)

    def train_batch_end(self, out: StepOutputs | None, batch: Any, batch_idx: int, accumulate: int = 1) -> None:
        """Each trial's ``on_train_batch_end`` with its own outputs (None: the step returned None).

        ``accumulate``: ``Trainer(accumulate_grad_batches=...)``; Lightning hands on the loss divided by it.
        """
        rows = self.slots.group.size
        outputs = [None] * rows if out is None else outputs_by_row(out, rows, training=True)
        if accumulate > 1:
            outputs = [_normalized(output, accumulate) for output in outputs]
        self.run("on_train_batch_end", lambda tid, row: (outputs[row], batch_of(out, row, batch), batch_idx), batch)

    def before_backward(
        self, losses: Tensor | None, batch: Any, accumulate: int = 1, without_loss: Collection[int] = ()
    ) -> None:
        """Each trial's ``on_before_backward`` with its own loss (its row of the ``[B]`` losses).

        ``accumulate``: ``Trainer(accumulate_grad_batches=...)``; Lightning runs backward on the loss divided by it.
        ``without_loss``: the rows whose step returned None (alone, no backward runs: nor does the hook).
        """
        if losses is not None:
            rows = losses / accumulate if accumulate > 1 else losses
            self.run("on_before_backward", lambda tid, row: (rows[row],), batch, leave_out=without_loss)

    def around_the_update(
        self, hook: str, batch: Any, without_loss: Collection[int] = (), without_gradients: Collection[int] = ()
    ) -> None:
        """``on_after_backward``, or ``on_before_optimizer_step`` / ``on_before_zero_grad`` with each one's optimizer.

        ``batch``: the batch being trained on (the size of an ``on_epoch`` mean a hook logs). ``without_loss``: the
        rows whose step returned None (no ``on_after_backward`` for them, as alone); ``without_gradients``: the rows
        with no loss since the last optimizer step (their hooks see no gradient, as alone).
        """
        if hook == "on_after_backward":
            self.run(hook, lambda tid, row: (), batch, leave_out=without_loss)
        else:
            self.run(hook, lambda tid, row: (self.optimizer_of(tid),), batch, without_gradients=without_gradients)

    # -- evaluation --------------------------------------------------------------------------------------------

    def eval_batch(self, hook: str, out: StepOutputs | None, batch: Any, batch_idx: int, *rest: Any) -> None:
        """A validation/test/predict ``on_*_batch_start`` (``out`` None) or ``on_*_batch_end`` hook, per trial.

        ``rest``: what Lightning passed after ``batch_idx`` (``dataloader_idx``, with several dataloaders).
        """
        if out is None:
            self.run(hook, lambda tid, row: (batch, batch_idx, *rest), batch)
        else:
            outputs = outputs_by_row(out, self.slots.group.size, training=False)
            self.run(hook, lambda tid, row: (outputs[row], batch_of(out, row, batch), batch_idx, *rest), batch)

    # -- the per-trial calls -------------------------------------------------------------------------------------

    def run(
        self,
        hook: str,
        arguments: Callable[[int, int], tuple[Any, ...]],
        batch: Any,
        *,
        leave_out: Collection[int] = (),
        without_gradients: Collection[int] = (),
    ) -> dict[int, Any]:
        """Call ``hook`` of every running trial that overrides it; returns each one's answer, by trial id.

        Args:
            hook: the hook's name.
            arguments: a trial id and its row to the hook's arguments.
            batch: the current batch (an ``on_epoch`` mean the hook logs is weighted by its size, as Lightning does).
            leave_out: rows whose trials are not called.
            without_gradients: rows whose trials see no gradient (their parameters' ``.grad`` is None).
        """
        group = self.slots.group
        trial_code_ran()  # the hooks may change each trial's Python state its own way
        gradients = hook in _WITH_GRADIENTS and any(p.grad is not None for p in group.params.values())
        if gradients:
            group.distribute_grads(row for row in range(group.size) if row not in without_gradients)
        answers: dict[int, Any] = {}
        logged: dict[str, tuple[list[int], list[Any], dict[str, Any]]] = {}
        try:
            for row, (tid, module) in enumerate(zip(group.trial_ids, group.modules)):
                if row in leave_out or not is_overridden(hook, module, L.LightningModule):
                    continue
                answers[tid], calls = call_trial_hook(hook, tid, module, *arguments(tid, row))
                for call in calls:
                    ids, values, _ = logged.setdefault(call.name, ([], [], call.options))
                    ids.append(tid)
                    values.append(call.value)
        finally:
            if gradients:  # the stacked gradients stay the truth; a change made in place through a view is in them
                group.clear_trial_grads()
            group.adopt_reassigned_buffers()  # what their code reassigned goes into their rows
        self.record(hook, logged, batch)
        return answers

    def record(self, hook: str, logged: dict[str, tuple[list[int], list[Any], dict[str, Any]]], batch: Any) -> None:
        """Book what the trials' hooks logged, by name: the trial ids, their values, the options."""
        phase = BATCH_HOOKS[hook]
        if phase is not None:
            for name, (ids, values, options) in logged.items():
                logs = [_stacked_log(name, values, options, self.slots.group.device)]
                self.metrics.record_step(phase, hook, logs, ids, batch)


def _normalized(output: Any, accumulate: int) -> Any:
    """A training step's outputs with the loss divided as Lightning divides it under gradient accumulation."""
    if isinstance(output, dict) and isinstance(output.get("loss"), Tensor):
        return {**output, "loss": output["loss"] / accumulate}
    return output


def _stacked_log(name: str, values: list[Any], options: dict[str, Any], device: torch.device) -> StackedLog:
    """The trials' values of one name, as a fused step's log: ``[n]`` numbers, or per-trial metric objects."""
    if all(hasattr(v, "compute") and hasattr(v, "reset") for v in values):  # torchmetrics metrics: at epoch end
        return StackedLog(name, values, options)
    return StackedLog(name, stack_values(values, device), options)
