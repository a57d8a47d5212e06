"""``compile=``: the vmapped training step under ``torch.compile``, with one eager fallback.

The function compiled is the whole vmapped call of the user's ``training_step`` over the stacked state
(:meth:`~lightning_hydro.backends.vmap_backend.VmapBackend.vmapped`): forward and, through AOTAutograd, the
backward that Lightning runs on its loss. It is compiled with ``fullgraph=True``, so that code torch.compile
cannot capture in one graph fails at once instead of silently splitting the step into pieces; then, and on any
other compile error, the backend says where and why in ONE log line and runs that method eagerly from then
on. ``"reduce-overhead"`` asks inductor for CUDA graphs (on a GPU; elsewhere it is plain ``True``).

A change of the group's size (a trial stopped or added) changes the leading dimension of every stacked
tensor; tensors keep static shapes (:func:`keep_static`), so each new group size compiles once more (no
recompiles in the steady state), while the step's ints (``batch_idx``, Lightning's counters) may become symbolic
(:class:`StepCompiler`). A step's compiled function keeps at most :data:`RECOMPILE_LIMIT` graphs (one per group
size and path through the step's branches; 8, dynamo's default, where its ints are specialised); past that the
step runs eagerly, said once. Costs measured in benchmarks/compile_step.py (docs/fused.md).
"""

from __future__ import annotations

import logging
import os
import types
from collections.abc import Callable
from typing import Any, Literal

import torch

__all__ = [
    "COMPILE_SETTINGS",
    "NOT_COMPILED",
    "RECOMPILE_LIMIT",
    "CompileSetting",
    "CompiledStep",
    "StepCompiler",
    "check_compile_setting",
    "compile_error",
    "keep_static",
    "mark_static_tensors",
    "own_code",
    "raised_compiling",
    "refused_recompile",
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


# graphs a step compiled with symbolic ints may keep (dynamo's default, 8, counts a graph per value where ints are
# specialised; here a graph per path through the step's branches and per group size)
RECOMPILE_LIMIT = 64

# where dynamo converts a frame and compiles its graph (an error raised there leaves the call not run)
_COMPILING = (os.path.join("_dynamo", "convert_frame.py"), os.path.join("_dynamo", "output_graph.py"))


def raised_compiling(err: BaseException) -> bool:
    """Whether ``err`` came from torch.compile compiling a frame (so nothing of that call has run).

    Most such errors are dynamo's own (:data:`NOT_COMPILED`). Others are recognised by where they were raised,
    dynamo's frame conversion and graph compilation, which running compiled code never enters, or by the compile
    error they were raised while handling: torch 2.11's handler of a backend's failure under vmap raises a functorch
    ``RuntimeError`` of its own (``!dynamicLayerStack.empty()``) in place of dynamo's ``BackendCompilerFailed``.
    """
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, NOT_COMPILED):
            return True
        frames = seen.__traceback__
        while frames is not None:
            if frames.tb_frame.f_code.co_filename.endswith(_COMPILING):
                return True
            frames = frames.tb_next
        seen = seen.__context__
    return False


def refused_recompile(err: BaseException) -> bool:
    """Whether ``err`` is a ``"fail_on_recompile"`` stance refusing a new graph (raised before anything ran).

    The whole step asks for that stance where a new graph must wait for a split step; the refusal is its signal,
    not a compile failure.
    """
    return isinstance(err, RuntimeError) and str(err).startswith("Detected recompile")


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


class StepCompiler:
    """``function`` under ``torch.compile`` (``fullgraph=True``) as a step is compiled: its ints may vary.

    A user's step reads values that change from step to step: ``batch_idx`` (``if batch_idx % 100 == 0``),
    ``self.global_step``, ``self.current_epoch``. Specialised (``dynamic=False``), each value needs a graph of its
    own, and after 8 (dynamo's recompile limit) the step runs eagerly. So first dynamo's automatic dynamic shapes
    make an int that has changed a symbol (its second graph serves every later value), also where the step reads
    it through a module (``self.trainer``: dynamo specialises a module's ints unless told otherwise). Tensor shapes
    stay static: the compiled function marks its tensors with :func:`keep_static` (vmap's randomness does not
    trace with a symbolic batch size, and a group's size is best compiled as a constant).

    A graph serves one path through the step's branches: a step that branches on its counters in several places
    needs a graph per combination (times each group size), so these functions may keep :data:`RECOMPILE_LIMIT`
    graphs, not dynamo's 8; a step's every new graph compiles once, and only the paths the fit takes.

    Inductor cannot compile every use of a symbolic int (torch 2.11-2.14: a float made from one, times a tensor
    under vmap). If compiling fails, the same function is compiled specialised, a graph per value, before the
    caller's own fallback: no step compiles worse than with ``dynamic=False``. Said once in the log.

    Args:
        function: what to compile (compiled as a copy with its own code object, :func:`own_code`).
        mode: ``torch.compile``'s mode (None, or ``"reduce-overhead"``).
        where: names the function in the log line.
    """

    def __init__(self, function: Callable[..., Any], mode: str | None, where: str) -> None:
        self.function, self.mode, self.where = function, mode, where
        self.specialised = ""  # why its ints are specialised (empty while they may be symbolic)
        compiled = torch.compile(own_code(function), fullgraph=True, dynamic=None, mode=mode)
        symbolic = torch._dynamo.config.patch(allow_unspec_int_on_nn_module=True, recompile_limit=RECOMPILE_LIMIT)
        self._compiled = symbolic(compiled)

    def __call__(self, *args: Any) -> Any:
        """The compiled call; raises what compiling the specialised function raised (nothing has run then)."""
        try:
            return self._compiled(*args)
        except Exception as err:
            limit = isinstance(err, torch._dynamo.exc.FailOnRecompileLimitHit)
            if self.specialised or limit or refused_recompile(err) or not raised_compiling(err):
                raise
            self.specialised = compile_error(err)
        log.info(
            "lightning_hydro: compile=True compiles %s with its ints specialised (a graph per value, 8 at most): "
            "torch.compile failed with them symbolic (%s).",
            self.where,
            self.specialised,
        )
        self._compiled = torch.compile(own_code(self.function), fullgraph=True, dynamic=False, mode=self.mode)
        return self._compiled(*args)


def keep_static(*trees: Any) -> None:
    """While torch.compile traces: every tensor in ``trees`` keeps static sizes (a new size is a new graph).

    Under :class:`StepCompiler` dynamo would make a size that changed symbolic (a group's size after a slot change);
    marked static, each size gets a graph of its own, as with ``dynamic=False``. ``trees`` hold tensors (and values
    the step guards on anyway): an int looked at here would be guarded on, and so never become symbolic. Eagerly:
    nothing.
    """
    if torch.compiler.is_compiling():
        mark_static_tensors(trees)


def mark_static_tensors(args: Any) -> None:
    """Mark the tensors in ``args`` (a step's batch) static before a compiled call, leaving its ints alone.

    The batch changes shape at an epoch's short last batch: marked, it gets a graph of its own (vmap's randomness
    does not trace with a symbolic batch size). Marked out here, eagerly, so that the compiled function never looks
    at ``batch_idx``, which :func:`keep_static` would guard on.
    """
    for leaf in torch.utils._pytree.tree_leaves(args):
        if isinstance(leaf, torch.Tensor):
            torch._dynamo.mark_static(leaf)


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
        # no CUDA graphs, also under "reduce-overhead": the split step's gradients are its backward graph's outputs,
        # which the update (another graph) would read after cudagraph trees had taken their memory back
        self._compiled = StepCompiler(function, None, where)

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
