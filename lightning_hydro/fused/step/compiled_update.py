"""``compile=`` for the fused update: a step's device work under ``torch.compile``, with one eager fallback.

A fused update's step (:mod:`.fused_update`) splits into host work (has a hyperparameter changed? which
parameters have gradients?) and device work: zeroing the skipped rows' gradients, selecting this step's
factors, the counters (Adam's bias corrections) and the foreach calls. The device work is pure tensor code,
:meth:`~lightning_hydro.fused.step.fused_update.FusedUpdate.device_step`; with ``compile=True`` it runs under
``torch.compile`` (``fullgraph=True``), so inductor fuses the update's elementwise passes into a few kernels.
This is the update of a split step (the first steps, and steps that cannot run whole); a steady step runs the
device work inside the whole step (:mod:`.whole_step`).

One :class:`CompiledUpdate` serves a fused module's group for its life: dynamo guards on the structure of what it
is given (how many parameters, their shapes and dtypes), so the update rebuilt after a slot change reuses the
compiled code when the group has the same size, and each new group size compiles once. Its code object is its own
(:func:`~lightning_hydro.backends.compiled_step.own_code`): other groups in the process neither share its graphs
nor count against its recompile limit. A compile error, or that limit, makes its later steps run eagerly, said in
one log line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lightning_hydro.backends.compile_check import CHECKED_CALLS, CheckSchedule, largest, mismatch, put_back
from lightning_hydro.backends.compiled_step import NOT_COMPILED, CompileSetting, compile_error, own_code

if TYPE_CHECKING:
    from lightning_hydro.fused.step.fused_update import FusedUpdate

__all__ = ["CompiledUpdate"]

log = logging.getLogger("lightning_hydro")


def _device_step(update: FusedUpdate, grads: list[list[Tensor]], skip: Tensor, prepared: Any) -> None:
    update.device_step(grads, skip, prepared)


class CompiledUpdate:
    """A group's fused update's device work under ``torch.compile``, eager for good after its first failure.

    Args:
        setting: True or ``"reduce-overhead"``.
    """

    def __init__(self, setting: CompileSetting) -> None:
        self.setting = setting
        self.failure = ""  # why the update runs eagerly (empty while compiled)
        self.calls = 0  # compiled calls that ran (tests)
        self.mismatch = ""  # a compiled step computed otherwise than the eager one (then also the failure)
        self._compiled: Callable[..., None] | None = None
        self._schedule = CheckSchedule(weak=True)  # each update's first compiled steps are checked

    def __call__(self, update: FusedUpdate, grads: list[list[Tensor]], skip: Tensor, prepared: Any) -> None:
        """The update's device work for one step: compiled, else eager."""
        if not self.failure:
            refused = update.why_not_compiled()
            if refused:
                self._eager_from_now(refused, refused)
        if self.failure:
            update.device_step(grads, skip, prepared)
            return
        if self._compiled is None:
            # no CUDA graph, also under "reduce-overhead": see compiled_step.CompiledStep
            self._compiled = torch.compile(own_code(_device_step), fullgraph=True, dynamic=False)
        check = self._schedule.due(update)
        written = update.device_tensors(grads) if check else []
        before = [t.clone() for t in written]
        try:
            self._compiled(update, grads, skip, prepared)
        except NOT_COMPILED as err:  # raised while tracing or compiling, or by the recompile limit: nothing ran
            failure = compile_error(err)
            self._eager_from_now(failure, f"torch.compile failed ({failure})")
            update.device_step(grads, skip, prepared)
            return
        self.calls += 1
        if check:
            self._check(update, grads, skip, prepared, written, before, self._schedule.take(update))

    def _check(
        self,
        update: FusedUpdate,
        grads: list[list[Tensor]],
        skip: Tensor,
        prepared: Any,
        written: list[Tensor],
        before: list[Tensor],
        number: int,
    ) -> None:
        """After one of an update's first compiled steps (``number``): the same step eagerly, whose result is kept.

        If the compiled step computed otherwise (beyond float rounding), the update runs eagerly from now on, and
        the whole step is not used (:meth:`FusedUpdate.why_not_compiled`): said in one log line. One extra eager
        step and two copies of what the step writes (before, and the compiled result), at each of an update's first
        :data:`~lightning_hydro.backends.compile_check.CHECKED_CALLS` compiled steps (a new group size or slot
        change makes a new update).
        """
        compiled = [t.clone() for t in written]
        put_back(written, before)
        update.device_step(grads, skip, prepared)
        try:
            worst = largest([mismatch(b, c, e) for b, c, e in zip(before, compiled, written)], update.device)
        except (RuntimeError, TypeError) as err:  # the eager step has run: its result stands either way
            self.mismatch = f"its compiled step could not be checked against the eager one ({compile_error(err)})"
        else:
            if worst > 1.0:
                self.mismatch = (
                    f"its compiled step computed otherwise than the eager one on {update.device.type} (check "
                    f"{number} of {CHECKED_CALLS}: an error {worst:.3g}x what float rounding allows)"
                )
        if self.mismatch:
            self._eager_from_now(self.mismatch, self.mismatch)

    def stop(self, reason: str) -> None:
        """Run every later step eagerly (``reason``: why, said in one log line), e.g. after the whole step's check."""
        if not self.failure:
            self._eager_from_now(reason, reason)

    def _eager_from_now(self, failure: str, said: str) -> None:
        """Run the update eagerly from now on (``failure``: why), said in one log line."""
        self.failure = failure
        log.warning("lightning_hydro: compile=%r runs the fused optimizer update eagerly: %s.", self.setting, said)
