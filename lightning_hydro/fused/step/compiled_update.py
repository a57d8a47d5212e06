"""``compile=`` for the fused update: a step's device work under ``torch.compile``, with one eager fallback.

A fused update's step (:mod:`.fused_update`) splits into host work (has a hyperparameter changed? which
parameters have gradients?) and device work: zeroing the skipped rows' gradients, selecting this step's
factors, the counters (Adam's bias corrections) and the foreach calls. The device work is pure tensor code,
:meth:`~lightning_hydro.fused.step.fused_update.FusedUpdate.device_step`; with ``compile=True`` it runs under
``torch.compile`` (``fullgraph=True``), so inductor fuses the update's elementwise passes into a few kernels,
and with ``compile="reduce-overhead"`` on a GPU inductor may replay them as a CUDA graph (not measured here:
no GPU was at hand when this was written).

One compiled function serves every group: dynamo guards on the structure of what it is given (how many
parameters, their shapes and dtypes), so a group of the same size after a slot change reuses the compiled code,
and each new group size compiles once. A compile error makes every later step run eagerly, said in one log line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from lightning_hydro.fused.step.fused_update import FusedUpdate

__all__ = ["compile_failure", "run_device_step"]

log = logging.getLogger("lightning_hydro")

_COMPILED: dict[bool | str, Callable[..., None]] = {}  # one torch.compile wrapper per setting, for every group
_FAILED: dict[bool | str, str] = {}  # settings whose compilation failed: why (their steps run eagerly)


def _device_step(update: FusedUpdate, grads: list[list[Tensor]], skip: Tensor, prepared: Any) -> None:
    update.device_step(grads, skip, prepared)


def compile_failure(setting: bool | str) -> str:
    """Why the update runs eagerly under ``setting`` (empty if it compiled, or was never tried)."""
    return _FAILED.get(setting, "")


def run_device_step(
    update: FusedUpdate, grads: list[list[Tensor]], skip: Tensor, prepared: Any, setting: bool | str
) -> None:
    """The update's device work for one step: compiled under ``setting`` (True or "reduce-overhead"), else eager."""
    if not setting or setting in _FAILED:
        update.device_step(grads, skip, prepared)
        return
    compiled = _COMPILED.get(setting)
    if compiled is None:
        mode = "reduce-overhead" if setting == "reduce-overhead" else None
        compiled = _COMPILED[setting] = torch.compile(_device_step, fullgraph=True, mode=mode)
    try:
        compiled(update, grads, skip, prepared)
    except torch._dynamo.exc.TorchDynamoException as err:  # raised while tracing or compiling: nothing ran yet
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        _FAILED[setting] = f"{type(err).__name__}: {first_line}"
        log.warning(
            "lightning_hydro: compile=%r runs the fused optimizer update eagerly: torch.compile failed (%s).",
            setting,
            _FAILED[setting],
        )
        update.device_step(grads, skip, prepared)
