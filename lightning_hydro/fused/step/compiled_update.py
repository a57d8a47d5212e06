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
        self._compiled: Callable[..., None] | None = None

    def __call__(self, update: FusedUpdate, grads: list[list[Tensor]], skip: Tensor, prepared: Any) -> None:
        """The update's device work for one step: compiled, else eager."""
        if self.failure:
            update.device_step(grads, skip, prepared)
            return
        if self._compiled is None:
            mode = "reduce-overhead" if self.setting == "reduce-overhead" else None
            self._compiled = torch.compile(own_code(_device_step), fullgraph=True, dynamic=False, mode=mode)
        try:
            self._compiled(update, grads, skip, prepared)
        except NOT_COMPILED as err:  # raised while tracing or compiling, or by the recompile limit: nothing ran
            self.failure = compile_error(err)
            log.warning(
                "lightning_hydro: compile=%r runs the fused optimizer update eagerly: torch.compile failed (%s).",
                self.setting,
                self.failure,
            )
            update.device_step(grads, skip, prepared)
            return
        self.calls += 1
