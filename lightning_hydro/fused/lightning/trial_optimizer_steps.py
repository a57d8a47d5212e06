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
from typing import Any

import torch
from torch import Tensor

from lightning_hydro.backends.errors import FusionError
from lightning_hydro.backends.python_state import trial_code_ran
from lightning_hydro.fused.lightning.hooks import call_trial_hook

__all__ = ["TrialOptimizerSteps"]


class _Stop(BaseException):
    """Ends a trial's thread that waits in its step when the group's step failed (not the user's to catch)."""


class _Channel:
    """A trial's thread and the group's: one asks, the other answers; only one of them runs at a time."""

    def __init__(self) -> None:
        self.asks: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.answers: queue.Queue[Any] = queue.Queue()

    def ask(self, what: str) -> Any:
        """From the trial's thread: ``"closure"`` or ``"step"``; waits for the answer (the trial's loss)."""
        self.asks.put((what, None))
        answer = self.answers.get()
        if answer is _STOP:
            raise _Stop
        return answer


_STOP = object()


class _OwnOptimizer:
    """What a trial's ``optimizer_step`` gets as ``optimizer``: its own optimizer, whose ``step`` the group runs."""

    def __init__(self, optimizer: torch.optim.Optimizer, channel: _Channel, trial: _TrialCall) -> None:
        self.optimizer = optimizer
        self._channel = channel
        self._trial = trial

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        """Wait for the group's step (its closure is Lightning's: the fused forward and backward); the trial's loss."""
        self._trial.stepped = True
        return self._channel.ask("step")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


class TrialOptimizerSteps:
    """Runs the trials' own ``optimizer_step`` around one group step (see the module's docstring)."""

    def run(
        self,
        trials: Sequence[tuple[int, Any, torch.optim.Optimizer]],
        arguments: tuple[int, int],
        closure: Callable[[], Any],
        group_step: Callable[[Callable[[], Any] | None], Any],
        losses: Callable[[], Tensor | None],
    ) -> tuple[bool, Any, dict[str, tuple[list[int], list[Any], dict[str, Any]]]]:
        """Each trial's ``optimizer_step(epoch, batch_idx, its optimizer, its closure)``, stepped as one group.

        Args:
            trials: ``(trial id, module, its own optimizer)`` of every running trial, in row order.
            arguments: ``(epoch, batch_idx)``, as Lightning passes them.
            closure: Lightning's closure (the fused forward and backward).
            group_step: steps the group, given the closure to run first (None: it ran already); returns the report.
            losses: the fused step's ``[B]`` losses, once the closure ran.

        Returns:
            Whether the trials stepped, the group step's report, and what the overrides logged: by name, the trial
            ids, their values and the options.
        """
        trial_code_ran()  # the overrides change each trial's Python state (its optimizer's param_groups)
        ran_closure = False
        calls = [
            _TrialCall(tid, row, module, optimizer, arguments) for row, (tid, module, optimizer) in enumerate(trials)
        ]
        waiting: list[_TrialCall] = []  # the trials waiting in their step
        try:
            for call, worker in zip(calls, _workers(len(calls))):
                worker.put(call.body)
                while True:
                    what = call.next_ask()
                    if what == "closure":
                        if not ran_closure:
                            closure()
                            ran_closure = True
                        call.answer(_row(losses(), call.row))
                    elif what == "step":
                        waiting.append(call)
                        break
                    else:  # the override returned (or raised)
                        call.finish()
                        break
            if waiting and len(waiting) != len(calls):
                stepping = ", ".join(str(call.tid) for call in waiting)
                others = ", ".join(str(call.tid) for call in calls if call not in waiting)
                raise FusionError(
                    f"FusedLightningModule: in batch {arguments[1]} the optimizer_step of trials {stepping} called "
                    f"optimizer.step() and that of trials {others} did not; a fused group steps its trials together. "
                    "Make the condition the same for every trial (e.g. on batch_idx), or fuse such trials in "
                    "separate groups."
                )
            report = group_step(None if ran_closure else closure) if waiting else None
            for call in waiting:  # each trial's code after its step, in turn
                call.answer(_row(losses(), call.row))
                what = call.next_ask()
                if what != "done":
                    again = "optimizer.step" if what == "step" else "optimizer_closure"
                    raise FusionError(
                        f"FusedLightningModule: trial {call.tid}'s optimizer_step called {again}() again after its "
                        "optimizer.step(); under automatic optimization a fused group steps each trial once per "
                        "optimizer_step."
                    )
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


class _TrialCall:
    """A trial's ``optimizer_step``, run by a worker thread, waiting in its step (see the module's docstring)."""

    def __init__(
        self, tid: int, row: int, module: Any, optimizer: torch.optim.Optimizer, arguments: tuple[int, int]
    ) -> None:
        self.tid, self.row = tid, row
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

    def next_ask(self) -> str:
        """Wait for the override's next request (``"closure"``, ``"step"``) or its end (``"done"``)."""
        what = self.channel.asks.get()[0]
        self.waiting = what != "done"
        return what

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
