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
import threading
import types
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch

from lightning_hydro.backends import compile_check
from lightning_hydro.backends.batch_copies import batch_tensors

__all__ = [
    "COMPILE_SETTINGS",
    "NOT_COMPILED",
    "RECOMPILE_LIMIT",
    "REDUCED_PRECISION_RELATIVE",
    "CompileSetting",
    "CompiledStep",
    "StepCompiler",
    "check_compile_setting",
    "compile_error",
    "eager_calls",
    "keep_static",
    "mark_static_tensors",
    "own_code",
    "raised_compiling",
    "reduced_precision_step",
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
    r"""What torch.compile raised, as the fallback's log line says it: ``"<type>: <its first line>"``.

    A first line that only introduces the cause (``"backend='inductor' raised:"``) is followed by the cause's.

    Example::

        >>> compile_error(RuntimeError("backend='inductor' raised:\nNotImplementedError: no storage\n\nmore"))
        "RuntimeError: backend='inductor' raised: NotImplementedError: no storage"
    """
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()] or [type(err).__name__]
    text = lines[0]
    if text.endswith(":") and len(lines) > 1:
        text = f"{text} {lines[1]}"
    return f"{type(err).__name__}: {text}"


_eager_only = threading.local()


@contextmanager
def eager_calls() -> Iterator[None]:
    """Within: compiled steps run their eager function.

    The first batch's verification runs the step once in eval mode and full precision: not worth a graph of its own.
    """
    before = getattr(_eager_only, "on", False)
    _eager_only.on = True
    try:
        yield
    finally:
        _eager_only.on = before


def under_function_mode() -> bool:
    """Whether a ``TorchFunctionMode`` is on (the first batch's check records the step's torch calls with one).

    Such a call runs eagerly, without counting as a compile failure: dynamo cannot trace the mode's own Python (it
    reads frames), and the mode is there for one call only.
    """
    return bool(torch._C._is_torch_function_mode_enabled())


# the split step's check in half or mixed precision: inductor keeps intermediates in float32 where eager code rounds
# them to bfloat16, so a right compiled step differs from eager by several percent (small digits models under
# bf16-mixed on the CPU: up to 8.7% of the gradients' norm, benchmarks/whole_step_check.py); only a gross error (a
# step taken twice, a wrong sign) is told apart there
REDUCED_PRECISION_RELATIVE = 0.5


# torch 2.11 fails to compile a vmapped step under autocast (bf16-mixed) with an internal assert in functorch's layers
# (`!dynamicLayerStack.empty()`), and compiled steps of later fits in the process then compile fewer graphs, or fail
# their backward (`MulBackward1 returned an invalid gradient`: tests/fused/step, torch 2.11, one process). So that
# torch does not try. torch 2.14 compiles it; 2.12 and 2.13 are not tested.
_AUTOCAST_ASSERTS = (
    "torch 2.11 cannot compile a vmapped step under autocast (an internal assert in functorch, which leaves later "
    "compiled fits in the process worse off): the split step runs eagerly under mixed precision"
    if tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 12)
    else ""
)


class CompiledStep:
    """The split step's forward (and through AOTAutograd its backward) under ``torch.compile``.

    It runs eagerly for good after its first failure, and its first calls per group size, mode (training or eval)
    and autocast setting are checked against the eager one (:meth:`_checked_call`).

    Args:
        function: the backend's vmapped call, ``(caller, recorder, method, params, buffers, args)`` -> ``(encoded,
            logged, metric_args, stored, calls, kind)`` (``VmapBackend.vmapped``).
        setting: True or ``"reduce-overhead"``.
        where: names the step in the fallback's log line (e.g. ``"vmap backend, DigitsMLP.training_step"``).
    """

    def __init__(self, function: Callable[..., Any], setting: CompileSetting, where: str) -> None:
        self.function = function
        self.where = where
        self.failure = ""  # why it runs eagerly (empty while compiled)
        self.mismatch = ""  # its check found the compiled step computing otherwise (then also the failure)
        self.checks = 0  # compiled calls checked against eager (for tests)
        self.unchecked = ""  # why the latest check could not compare ("" if it did, or none ran)
        self.worst = 0.0  # the largest error of the checks so far, in units of what float rounding allows (<= 1)
        # by (group size, training, autocast): a graph's first calls are checked
        self._schedule = compile_check.CheckSchedule()
        # no CUDA graphs, also under "reduce-overhead": the split step's gradients are its backward graph's outputs,
        # which the update (another graph) would read after cudagraph trees had taken their memory back
        self._compiled = StepCompiler(function, None, where)

    def fall_back(self, reason: str) -> None:
        """Run eagerly from now on, said in one log line."""
        self.failure = reason
        log.warning("lightning_hydro: compile=True falls back to eager for %s: %s.", self.where, reason)

    def __call__(self, *args: Any) -> Any:
        """The compiled call, or the eager one once compiling has failed."""
        if self.failure or under_function_mode() or getattr(_eager_only, "on", False):
            return self.function(*args)
        params, buffers = args[3], args[4]
        device = next(iter(params.values())).device if params else torch.device("cpu")
        autocast = torch.is_autocast_enabled(device.type)
        if autocast and _AUTOCAST_ASSERTS:
            self.fall_back(_AUTOCAST_ASSERTS)
            return self.function(*args)
        # a graph of its own (eval mode: a validation step; another autocast setting): checked apart
        key = (
            next(iter(params.values())).shape[0] if params else 0,
            bool(getattr(getattr(args[0], "module", args[0]), "training", True)),
            autocast,
        )
        # several processes: DDP expects one forward and one backward per step, so no check runs there
        check = self._schedule.due(key) and not _several_processes()
        kept = list(buffers.values()) if check else []
        before = [b.clone() for b in kept]
        # the batch, put back too (not compared): a step may write into it (x.mul_(2)), and the eager run must get it
        # as it came, not written twice
        batch = [t for t in batch_tensors(args[5]) if all(t is not b for b in kept)] if check else []
        batch_before = [t.clone() for t in batch]
        generators = compile_check.rng_states(device) if check else []
        try:
            result = self._compiled(*args)
        except Exception as err:
            self.fall_back(f"torch.compile failed ({compile_error(err)})")
            return self.function(*args)
        if not check:
            return result
        number = self._schedule.take(key)
        return self._checked_call(args, result, device, (kept, before), (batch, batch_before), generators, number)

    def _checked_call(
        self,
        args: tuple[Any, ...],
        compiled: Any,
        device: torch.device,
        buffers: tuple[list[torch.Tensor], list[torch.Tensor]],
        batch: tuple[list[torch.Tensor], list[torch.Tensor]],
        generators: list[torch.Tensor],
        number: int,
    ) -> Any:
        """After one of a graph's first compiled calls (``number``: which): the same call eagerly, whose result is kept.

        Compared: each row's loss, the gradients of the sum of the finite losses (taken with ``torch.autograd.grad``
        from each call's graph; Lightning's backward then runs on the eager one), and the buffers the forward
        updates (BatchNorm's statistics), each as one group (:func:`~.compile_check.group_mismatch`; 1e-3 of its
        size in float32, :data:`REDUCED_PRECISION_RELATIVE` in half or mixed precision). A difference beyond that
        makes the step run eagerly from now on, said in one log line. A step that draws random numbers is not
        compared (compiled code draws its own). Its cost, at each of the first
        :data:`~lightning_hydro.backends.compile_check.CHECKED_CALLS` calls per group size: one eager forward and two
        backwards, a copy of the gradients, of the buffers and of the batch (put back before the eager call: a step
        that writes into its batch writes once).
        """
        kept, before = buffers
        trainable = [p for p in args[3].values() if p.requires_grad]
        compiled_buffers = [b.clone() for b in kept]
        compiled_losses, compiled_grads = _losses_and_gradients(compiled, trainable, retain=False)
        eager, random = compile_check.eager_again(
            [*kept, *batch[0]], [*before, *batch[1]], device, generators, lambda: self.function(*args)
        )
        self.checks += 1
        self.unchecked = ""
        if random:
            self.unchecked = compile_check.RANDOM
            if number == 1:
                log.info("lightning_hydro: compile=True: the check of %s: %s.", self.where, self.unchecked)
            return eager
        eager_losses, eager_grads = _losses_and_gradients(eager, trainable, retain=True)
        relative = REDUCED_PRECISION_RELATIVE if reduced_precision_step(device, trainable) else 1e-3
        compared = [(before, compiled_buffers, kept)]
        if compiled_losses is not None and eager_losses is not None:
            compared.append(([torch.zeros_like(eager_losses)], [compiled_losses], [eager_losses]))
        if compiled_grads is not None and eager_grads is not None:
            compared.append(([torch.zeros_like(g) for g in eager_grads], compiled_grads, eager_grads))
        ratios = [compile_check.group_mismatch(b, c, e, relative=relative) for b, c, e in compared if e]
        worst = compile_check.largest(ratios, device)
        self.worst = max(self.worst, worst)
        if worst > 1.0:
            self.mismatch = (
                f"its compiled call (check {number} of {compile_check.CHECKED_CALLS}) computed otherwise than the "
                f"eager one on {device.type} (an error {worst:.3g}x what float rounding allows); the eager result was "
                "kept"
            )
            self.fall_back(self.mismatch)
        return eager


def _several_processes() -> bool:
    return (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    )


def reduced_precision_step(device: torch.device, params: Iterable[torch.Tensor]) -> bool:
    """Whether a step computes in half or mixed precision (autocast on, or half parameters)."""
    if torch.is_autocast_enabled(device.type) or torch.is_autocast_enabled("cpu"):
        return True
    return any(p.dtype in (torch.float16, torch.bfloat16) for p in params)


def _losses_and_gradients(
    result: tuple[Any, ...], params: list[torch.Tensor], *, retain: bool
) -> tuple[torch.Tensor | None, list[torch.Tensor] | None]:
    """A vmapped call's ``[B]`` losses (detached) and the gradients of the sum of the finite ones (None: no loss).

    ``retain``: keep the call's graph (Lightning's backward runs on it after).
    """
    encoded, kind = result[0], result[5]
    losses = encoded if kind == "tensor" else encoded.get("loss") if kind == "dict" else None
    if not isinstance(losses, torch.Tensor):
        return None, None
    losses = losses.reshape(-1)
    if not losses.requires_grad or not params:
        return losses.detach(), None
    total = torch.where(torch.isfinite(losses.detach()), losses, 0.0).sum()
    try:
        grads = torch.autograd.grad(total, params, retain_graph=retain, allow_unused=True)
    except RuntimeError as err:  # a backward that cannot run twice here (activation checkpointing): no gradients
        log.info("lightning_hydro: compile=True: the compiled call's check compares no gradients (%s).", err)
        return losses.detach(), None
    return losses.detach(), [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
