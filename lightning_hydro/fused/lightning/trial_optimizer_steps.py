"""The trials' own ``optimizer_step``: a learning-rate warm-up written there, as Lightning's docs write it, per trial.

Lightning's docs show a warm-up in the ``optimizer_step`` hook::

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        optimizer.step(closure=optimizer_closure)
        if self.trainer.global_step < 500:  # manually warm up lr without a scheduler
            lr_scale = min(1.0, float(self.trainer.global_step + 1) / 500.0)
            for pg in optimizer.param_groups:
                pg["lr"] = lr_scale * self.hparams.learning_rate

A fused group updates every trial in one step after one fused forward and backward, but each trial's code around
its ``optimizer.step`` must run as alone: what it does before the step sets this step's learning rate, what it does
after sees the updated weights (an EMA of them, say) and sets the next one's. So each trial's override runs as a
coroutine of its own (a ``greenlet``: a call stack that can pause, in the same thread), and its ``optimizer`` is a
stand-in for its own optimizer (its ``param_groups`` are the trial's own) whose ``step`` pauses there. When every
trial has paused in its step, the group steps once, as it does without the override: Lightning's closure (the fused
forward and backward, clipping, ``on_before_optimizer_step``), then one update of every trial with the
hyperparameters its code has set. Then each trial's code goes on after its step, one trial after another, in the
order of their rows, as it would one trial after another.

Greenlets, not threads: the threads' hand-offs took a fused step of 16 small trials from 2 to 7 ms on a 2-core CPU,
the greenlets' switches to 3 ms (docs/fused.md, "The steady step's own cost"), and the trials' code runs in the thread
that runs it alone,
with that thread's device, autocast and grad mode. Each paused call keeps its own grad mode (``with
torch.no_grad():`` around its ``optimizer.step()`` does not reach the group's closure or the other trials).

A trial that calls ``optimizer_closure()`` itself gets the fused forward and backward run then (once for the group)
and its own loss back; an override that steps in some batches only (Lightning's docs: an alternating schedule that
calls only the closure in the others) does so for the whole group. Trials that disagree in a batch about whether to
step cannot be stepped together: refused, naming them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from greenlet import greenlet
from torch import Tensor

from lightning_hydro.backends.errors import FusionError
from lightning_hydro.backends.python_state import trial_code_ran
from lightning_hydro.fused.lightning.hooks import call_trial_hook
from lightning_hydro.stacking.stacked_state import StackedState

__all__ = ["GroupStep", "TrialOptimizerSteps"]


class _Stop(BaseException):
    """Ends a trial's call paused in its step when the group's step failed (not the user's to catch)."""


_STOP = object()


class _OwnOptimizer:
    """What a trial's ``optimizer_step`` gets as ``optimizer``: its own optimizer, whose ``step`` the group runs.

    Its ``param_groups`` are the trial's own; ``zero_grad`` clears the trial's gradients (with ``set_to_none``, the
    trial is then not updated in this step, as torch's optimizers pass over a parameter without a gradient); its
    ``state`` is the trial's own where the group steps each trial's optimizer (``optimizer_path="universal"``), and
    refused where the fused update keeps every trial's state stacked.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, trial: _TrialCall) -> None:
        self.optimizer = optimizer
        self._trial = trial

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:
        if not self._trial.own_state:
            raise FusionError(
                f"FusedLightningModule: trial {self._trial.tid}'s optimizer_step reads optimizer.state, which the "
                "group's fused update keeps stacked for every trial (the trial's own optimizer holds none of it). "
                "FusedLightningModule(..., optimizer_path='universal') steps each trial's own optimizer, whose state "
                "optimizer_step then reads as alone."
            )
        return self.optimizer.state

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        """Wait for the group's step (its closure is Lightning's: the fused forward and backward); the trial's loss."""
        self._trial.stepped = True
        return self._trial.ask("step", closure is not None)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the trial's gradients (the group's rows of them)."""
        self._trial.ask("zero_grad", set_to_none)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


class TrialOptimizerSteps:
    """Runs the trials' own ``optimizer_step`` around one group step (see the module's docstring)."""

    def run(
        self,
        trials: Sequence[tuple[int, Any, torch.optim.Optimizer]],
        arguments: tuple[int, int],
        closure: Callable[[], Any],
        group: GroupStep,
    ) -> tuple[bool, Any, dict[str, tuple[list[int], list[Any], dict[str, Any]]]]:
        """Each trial's ``optimizer_step(epoch, batch_idx, its optimizer, its closure)``, stepped as one group.

        Args:
            trials: ``(trial id, module, its own optimizer)`` of every running trial, in row order.
            arguments: ``(epoch, batch_idx)``, as Lightning passes them.
            closure: Lightning's closure (the fused forward and backward).
            group: the group's step, losses and gradients (the fused module's).

        Returns:
            Whether the trials stepped, the group step's report, and what the overrides logged: by name, the trial
            ids, their values and the options.
        """
        trial_code_ran()  # the overrides change each trial's Python state (its optimizer's param_groups)
        ran_closure = False
        own_state = group.own_state()
        calls = [
            _TrialCall(tid, row, module, optimizer, arguments, own_state)
            for row, (tid, module, optimizer) in enumerate(trials)
        ]
        waiting: list[_TrialCall] = []  # the trials waiting in their step
        losses: list[Tensor | None] = []  # each row's loss of the closure that ran last (one unbind for all)

        def loss_of(call: _TrialCall) -> Tensor | None:
            """The trial's loss, as its closure returns it alone (detached)."""
            if not losses:
                stacked = group.losses()
                losses.extend([None] * len(calls) if stacked is None else stacked.detach().unbind())
            return losses[call.row]

        def answer(call: _TrialCall, what: str, payload: Any) -> None:
            """The group's side of a request that does not end the trial's turn."""
            nonlocal ran_closure
            if what == "closure":
                if not ran_closure:
                    closure()
                    ran_closure = True
                    group.share()  # each trial's .grad its rows of the gradients, as alone after the closure
                call.answer(loss_of(call))
            else:  # "zero_grad": after the closure, this trial's gradients (before it, the closure clears them)
                if ran_closure:
                    group.zero(call.row, set_to_none=payload)
                call.answer(None)

        try:
            for call in calls:
                while True:
                    what, payload = call.next_ask()
                    if what == "step":
                        call.passed_closure = payload
                        waiting.append(call)
                        break
                    if what == "done":  # the override returned (or raised)
                        call.finish()
                        break
                    answer(call, what, payload)
            if waiting and len(waiting) != len(calls):
                stepping = ", ".join(str(call.tid) for call in waiting)
                others = ", ".join(str(call.tid) for call in calls if call not in waiting)
                raise FusionError(
                    f"FusedLightningModule: in batch {arguments[1]} the optimizer_step of trials {stepping} called "
                    f"optimizer.step() and that of trials {others} did not; a fused group steps its trials together. "
                    "Make the condition the same for every trial (e.g. on batch_idx), or fuse such trials in "
                    "separate groups."
                )
            report = None
            if waiting:
                # alone, optimizer.step(closure=optimizer_closure) after optimizer_closure() runs the closure again
                again = {call.passed_closure for call in waiting}
                if ran_closure and len(again) > 1:
                    raise FusionError(
                        f"FusedLightningModule: in batch {arguments[1]} some trials' optimizer_step passed the closure "
                        "to optimizer.step() after calling it and others did not; the group runs its closure for "
                        "every trial at once. Make the calls the same for every trial."
                    )
                group.unshare()
                report = group.step(closure if not ran_closure or again == {True} else None)
                losses.clear()  # the step may have run the closure (again)
                group.share()  # the code after the step sees its gradients, as alone
            for call in waiting:  # each trial's code after its step, in turn
                call.answer(loss_of(call))
                while True:
                    what, payload = call.next_ask()
                    if what == "done":
                        break
                    if what == "step":
                        raise FusionError(
                            f"FusedLightningModule: trial {call.tid}'s optimizer_step called optimizer.step() again "
                            "after its step; under automatic optimization a fused group steps each trial once per "
                            "optimizer_step."
                        )
                    answer(call, what, payload)
                call.finish()
            logged: dict[str, tuple[list[int], list[Any], dict[str, Any]]] = {}
            for call in calls:
                for log in call.calls:
                    ids, values, _ = logged.setdefault(log.name, ([], [], log.options))
                    ids.append(call.tid)
                    values.append(log.value)
            return any(call.stepped for call in calls), report, logged
        finally:
            for call in calls:  # after a failure: the overrides that still wait end
                call.stop()
            group.unshare()  # the stacked gradients stay the truth; a change made through a view is in them


@dataclass
class GroupStep:
    """The fused module's side of the trials' ``optimizer_step``: its group's step, losses and gradients.

    Args:
        stacked: the group's stacked state (its gradients, the trials' views of them).
        step: steps the group, running the closure given first (None: it ran already); returns the report.
        losses: the ``[B]`` losses a trial's closure returns alone (None before the closure ran).
        own_state: whether each trial's optimizer holds its own state (the universal path steps it).
        leave_out: a trial (by id) not to update in this step: its code cleared its gradients.
    """

    stacked: StackedState
    step: Callable[[Callable[[], Any] | None], Any]
    losses: Callable[[], Tensor | None]
    own_state: Callable[[], bool]
    leave_out: Callable[[int], None]

    def share(self) -> None:
        """Each trial parameter's ``.grad``: its row of the stacked gradients (a change in place reaches them)."""
        self.stacked.distribute_grads()

    def unshare(self) -> None:
        """The trials' gradient views dropped (the stacked gradients stay the truth)."""
        self.stacked.clear_trial_grads()

    def zero(self, row: int, *, set_to_none: bool) -> None:
        """The row's gradients zeroed; with ``set_to_none`` gone from the trial and its update left out, as alone."""
        with torch.no_grad():
            for param in self.stacked.params.values():
                if param.grad is not None:
                    param.grad[row].zero_()
        if set_to_none:
            self.stacked.clear_trial_grads([row])
            self.leave_out(self.stacked.trial_ids[row])


class _TrialCall:
    """A trial's ``optimizer_step``, run as a greenlet that pauses in its step (see the module's docstring).

    The group's side resumes it with :meth:`next_ask` (after :meth:`answer` said what the paused call returns) and
    gets back its next request, ``(what, payload)``; the trial's side asks with :meth:`ask`.
    """

    def __init__(
        self,
        tid: int,
        row: int,
        module: Any,
        optimizer: torch.optim.Optimizer,
        arguments: tuple[int, int],
        own_state: bool,
    ) -> None:
        self.tid, self.row, self.own_state = tid, row, own_state
        self.passed_closure = False  # its optimizer.step got the closure
        self.calls: list[Any] = []  # what the override logged
        self.stepped = False
        self.waiting = False  # it has asked and waits for the answer
        self._failure: list[BaseException] = []
        self._answer: Any = None  # what the paused call returns when it is resumed
        self._greenlet = greenlet(self._body)
        self._group_side: greenlet | None = None  # the greenlet that resumed it last (it asks that one)
        own_closure = lambda: self.ask("closure")  # noqa: E731
        self._arguments = (module, (*arguments, _OwnOptimizer(optimizer, self), own_closure))

    def _body(self, _: Any = None) -> tuple[str, Any]:
        """The greenlet: the override; then says that it returned (or keeps what it raised)."""
        module, arguments = self._arguments
        try:
            self.calls = call_trial_hook("optimizer_step", self.tid, module, *arguments)[1]
        except _Stop:
            pass
        except BaseException as err:
            self._failure.append(err)
        return ("done", None)

    def ask(self, what: str, payload: Any = None) -> Any:
        """From the trial's code: ``"closure"``, ``"step"`` or ``"zero_grad"``; pauses it until the group answers."""
        grad_enabled = torch.is_grad_enabled()  # the trial's, kept across the pause
        assert self._group_side is not None  # set by next_ask, which runs this code
        answer = self._group_side.switch((what, payload))
        torch.set_grad_enabled(grad_enabled)
        if answer is _STOP:
            raise _Stop
        return answer

    def next_ask(self) -> tuple[str, Any]:
        """Let the override run to its next request (``"closure"``, ``"step"``, ``"zero_grad"``) or end (``"done"``)."""
        grad_enabled = torch.is_grad_enabled()  # the group's, whatever the trial's code left
        answer, self._answer = self._answer, None
        self._group_side = greenlet.getcurrent()
        what, payload = self._greenlet.switch(answer)
        torch.set_grad_enabled(grad_enabled)
        self.waiting = what != "done"
        return what, payload

    def answer(self, value: Any) -> None:
        """What the paused call returns when :meth:`next_ask` resumes it."""
        self.waiting = False
        self._answer = value

    def finish(self) -> None:
        """The override has returned: what it raised is raised here."""
        if self._failure:
            raise self._failure[0]

    def stop(self) -> None:
        """End an override that still waits (the group's step failed): it unwinds from its pause."""
        while self.waiting:
            self.answer(_STOP)
            self.next_ask()
