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
after sees the updated weights (an EMA of them, say) and sets the next one's. So each trial's override runs on a
worker thread of its own (the process keeps its workers for the next step: starting a thread costs more than a
small step), and its ``optimizer`` is a stand-in for its own optimizer (its ``param_groups`` are the trial's
own) whose ``step`` waits there. When every trial waits in its step, the group steps once, as it does without the
override: Lightning's closure (the fused forward and backward, clipping, ``on_before_optimizer_step``), then one
update of every trial with the hyperparameters its code has set. Then each trial's code goes on after its step, one
trial after another. Only one thread runs at any time, the others wait, so the trials' code runs in turn, in the
order of their rows, as it would one trial after another.

A trial that calls ``optimizer_closure()`` itself gets the fused forward and backward run then (once for the group)
and its own loss back; an override that steps in some batches only (Lightning's docs: an alternating schedule that
calls only the closure in the others) does so for the whole group. Trials that disagree in a batch about whether to
step cannot be stepped together: refused, naming them.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_hydro.backends.errors import FusionError
from lightning_hydro.backends.python_state import trial_code_ran
from lightning_hydro.fused.lightning.hooks import call_trial_hook
from lightning_hydro.stacking.stacked_state import StackedState

__all__ = ["GroupStep", "TrialOptimizerSteps"]


class _Stop(BaseException):
    """Ends a trial's thread that waits in its step when the group's step failed (not the user's to catch)."""


class _Channel:
    """A trial's thread and the group's: one asks, the other answers; only one of them runs at a time."""

    def __init__(self) -> None:
        self.asks: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.answers: queue.Queue[Any] = queue.Queue()

    def ask(self, what: str, payload: Any = None) -> Any:
        """From the trial's thread: ``"closure"``, ``"step"`` or ``"zero_grad"``; waits for the answer."""
        self.asks.put((what, payload))
        answer = self.answers.get()
        if answer is _STOP:
            raise _Stop
        return answer


_STOP = object()


class _OwnOptimizer:
    """What a trial's ``optimizer_step`` gets as ``optimizer``: its own optimizer, whose ``step`` the group runs.

    Its ``param_groups`` are the trial's own; ``zero_grad`` clears the trial's gradients (with ``set_to_none``, the
    trial is then not updated in this step, as torch's optimizers pass over a parameter without a gradient); its
    ``state`` is the trial's own where the group steps each trial's optimizer (``optimizer_path="universal"``), and
    refused where the fused update keeps every trial's state stacked.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, channel: _Channel, trial: _TrialCall) -> None:
        self.optimizer = optimizer
        self._channel = channel
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
        return self._channel.ask("step", closure is not None)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the trial's gradients (the group's rows of them)."""
        self._channel.ask("zero_grad", set_to_none)

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

        def answer(call: _TrialCall, what: str, payload: Any) -> None:
            """The main thread's side of a request that does not end the trial's turn."""
            nonlocal ran_closure
            if what == "closure":
                if not ran_closure:
                    closure()
                    ran_closure = True
                    group.share()  # each trial's .grad its rows of the gradients, as alone after the closure
                call.answer(_row(group.losses(), call.row))
            else:  # "zero_grad": after the closure, this trial's gradients (before it, the closure clears them)
                if ran_closure:
                    group.zero(call.row, set_to_none=payload)
                call.answer(None)

        try:
            for call, worker in zip(calls, _workers(len(calls))):
                worker.put(call.body)
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
                group.share()  # the code after the step sees its gradients, as alone
            for call in waiting:  # each trial's code after its step, in turn
                call.answer(_row(group.losses(), call.row))
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
    """A trial's ``optimizer_step``, run by a worker thread, waiting in its step (see the module's docstring)."""

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
        self.channel = _Channel()
        self.calls: list[Any] = []  # what the override logged
        self.stepped = False
        self.waiting = False  # it has asked and waits for the answer
        self._failure: list[BaseException] = []
        own_closure = lambda: self.channel.ask("closure")  # noqa: E731
        self._arguments = (module, (*arguments, _OwnOptimizer(optimizer, self.channel, self), own_closure))
        # the trials' code creates tensors on the device of the process (a DDP rank's), as in the main thread
        self._device = torch.cuda.current_device() if torch.cuda.is_initialized() else None

    def body(self) -> None:
        """What the worker runs: the override; then says that it returned (or what it raised)."""
        module, arguments = self._arguments
        try:
            if self._device is not None:
                torch.cuda.set_device(self._device)
            self.calls = call_trial_hook("optimizer_step", self.tid, module, *arguments)[1]
        except _Stop:
            pass
        except BaseException as err:
            self._failure.append(err)
        self.channel.asks.put(("done", None))

    def next_ask(self) -> tuple[str, Any]:
        """Wait for the override's next request (``"closure"``, ``"step"``, ``"zero_grad"``) or its end (``"done"``)."""
        what, payload = self.channel.asks.get()
        self.waiting = what != "done"
        return what, payload

    def answer(self, value: Any) -> None:
        """Let the waiting override go on, with ``value`` as what its call returns."""
        self.waiting = False
        self.channel.answers.put(value)

    def finish(self) -> None:
        """The override has returned: what it raised is raised here."""
        if self._failure:
            raise self._failure[0]

    def stop(self) -> None:
        """End an override that still waits (the group's step failed): it unwinds, and its worker is free again."""
        if self.waiting:
            self.answer(_STOP)
            while self.channel.asks.get()[0] != "done":
                pass


class _Worker:
    """A daemon thread that runs the jobs it is given, one after another (a new thread per step costs more)."""

    def __init__(self, index: int) -> None:
        self._jobs: queue.Queue[Callable[[], None]] = queue.Queue()
        threading.Thread(target=self._loop, name=f"lightning_hydro optimizer_step {index}", daemon=True).start()

    def put(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def _loop(self) -> None:
        while True:
            self._jobs.get()()


_WORKERS: list[_Worker] = []  # the process's workers, as many as the largest group has had trials


def _workers(count: int) -> list[_Worker]:
    while len(_WORKERS) < count:
        _WORKERS.append(_Worker(len(_WORKERS)))
    return _WORKERS[:count]


def _row(losses: Tensor | None, row: int) -> Tensor | None:
    """The trial's loss, as its closure returns it alone (detached)."""
    return None if losses is None else losses[row].detach()
