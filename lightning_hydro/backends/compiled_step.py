"""``compile=``: the vmapped training step under ``torch.compile``, with one eager fallback.

The function compiled is the whole vmapped call of the user's ``training_step`` over the stacked state
(:meth:`~lightning_hydro.backends.vmap_backend.VmapBackend.vmapped`): forward and, through AOTAutograd, the
backward that Lightning runs on its loss. It is compiled with ``fullgraph=True``, so that code torch.compile
cannot capture in one graph fails at once instead of silently splitting the step into pieces; then, and on any
other compile error, the backend says where and why in ONE log line and runs that method eagerly from then
on. ``"reduce-overhead"`` asks inductor for CUDA graphs (on a GPU; elsewhere it is plain ``True``).

A change of the group's size (a trial stopped or added) changes the leading dimension of every stacked
tensor; parameters keep static shapes under torch.compile, so each new group size compiles once more (no
recompiles in the steady state). torch.compile keeps at most ``torch._dynamo.config.recompile_limit`` (8)
graphs per function; sizes beyond that run eagerly, with dynamo's own warning. Costs measured in
benchmarks/compile_step.py (docs/fused.md).
"""

from __future__ import annotations

import logging
import types
from collections.abc import Callable
from typing import Any, Literal

import torch

__all__ = [
    "COMPILE_SETTINGS",
    "NOT_COMPILED",
    "CompileSetting",
    "CompiledStep",
    "check_compile_setting",
    "compile_error",
    "own_code",
    "under_function_mode",
]

CompileSetting = bool | Literal["reduce-overhead"]
COMPILE_SETTINGS: tuple[CompileSetting, ...] = (False, True, "reduce-overhead")

log = logging.getLogger("lightning_hydro")


def check_compile_setting(compile: Any) -> CompileSetting:
    """Validate a ``compile=`` argument.

    Raises:
        ValueError: for anything but False, True or "reduce-overhead".
    """
    if compile is False or compile is True or compile == "reduce-overhead":
        return compile
    raise ValueError(
        f"compile must be False, True or 'reduce-overhead', got {compile!r}; use compile=True to run the fused "
        "training step under torch.compile (compile='reduce-overhead' adds CUDA graphs on a GPU)."
    )


# what torch.compile raises before anything has run: tracing or compiling failed, or the recompile limit was hit
NOT_COMPILED = (torch._dynamo.exc.TorchDynamoException, torch._dynamo.exc.FailOnRecompileLimitHit)


def own_code(function: Callable[..., Any]) -> Callable[..., Any]:
    """A copy of ``function`` (or of a bound method) with a code object of its own, for ``torch.compile``.

    Dynamo keeps its compiled graphs, and counts them against ``recompile_limit`` (8), per code object: compiled
    as it is, every group in a process would share one cache (each new group recompiling into it, until the limit
    makes the rest run eagerly). A copy per group gives each group its own, which goes with the group.
    """
    bound = getattr(function, "__self__", None)
    plain = getattr(function, "__func__", function)
    copy = types.FunctionType(
        plain.__code__.replace(), plain.__globals__, plain.__name__, plain.__defaults__, plain.__closure__
    )
    copy.__kwdefaults__ = plain.__kwdefaults__
    copy.__qualname__ = plain.__qualname__
    return types.MethodType(copy, bound) if bound is not None else copy


def compile_error(err: BaseException) -> str:
    """What torch.compile raised, as the fallback's log line says it: ``"<type>: <its first line>"``."""
    first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return f"{type(err).__name__}: {first_line}"


def under_function_mode() -> bool:
    """Whether a ``TorchFunctionMode`` is on (the first batch's check records the step's torch calls with one).

    Such a call runs eagerly, without counting as a compile failure: dynamo cannot trace the mode's own Python (it
    reads frames), and the mode is there for one call only.
    """
    return bool(torch._C._is_torch_function_mode_enabled())


class CompiledStep:
    """One function under ``torch.compile``, falling back to eager for good on its first failure.

    Args:
        function: the function to compile (the backend's vmapped call).
        setting: True or ``"reduce-overhead"``.
        where: names the step in the fallback's log line (e.g. ``"vmap backend, DigitsMLP.training_step"``).
    """

    def __init__(self, function: Callable[..., Any], setting: CompileSetting, where: str) -> None:
        self.function = function
        self.where = where
        self.failure = ""  # why it runs eagerly (empty while compiled)
        mode = "reduce-overhead" if setting == "reduce-overhead" else None
        self._compiled = torch.compile(own_code(function), fullgraph=True, dynamic=False, mode=mode)

    def fall_back(self, reason: str) -> None:
        """Run eagerly from now on, said in one log line."""
        self.failure = reason
        log.warning("lightning_hydro: compile=True falls back to eager for %s: %s.", self.where, reason)

    def __call__(self, *args: Any) -> Any:
        """The compiled call, or the eager one once compiling has failed."""
        if self.failure or under_function_mode():
            return self.function(*args)
        try:
            return self._compiled(*args)
        except Exception as err:
            self.fall_back(f"torch.compile failed ({compile_error(err)})")
        return self.function(*args)
