"""The ``vmap`` backend: one vectorised call of the user's method over the stacked trial state.

``torch.func.functional_call`` runs the user's method (e.g. ``training_step``) on a template module with
the parameters and buffers swapped for one trial's row, and ``torch.func.vmap`` maps that over the rows:
one forward and one backward for all B trials. The data batch is shared (not mapped); dropout draws
independent masks per trial (``randomness="different"``); BatchNorm running statistics update in place in
each trial's row of the stacked buffers.

vmap runs ONE template module for all trials, so Python attributes of the trial modules must agree
(the fused module verifies this on the first batch); code that vmap cannot batch raises a
:class:`~lightning_hydro.backends.errors.FusionError` naming the op and the line. What the step does to
Python state (a counter, ``self.training_step_outputs.append(loss)``) reaches each trial's own module as if
it had run alone (:mod:`~lightning_hydro.backends.step_state`).

While the step runs, the trial rules of :mod:`lightning_hydro.backends.trial_ops` replace vmap's own batching of
attention and, in half or mixed precision, of normalisation, linear layers and convolutions (and apply
autocast's precision policy before vmap rewrites an op): each runs every trial in one kernel call with the
arguments, and at the dtypes, of the unfused call, so the fused step computes what each trial computes alone,
on CUDA as on CPU, in every precision.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap
from torch.utils._pytree import tree_flatten, tree_unflatten
from typing_extensions import override

from lightning_hydro.backends.base import Backend, StackedLog, StepOutputs, step_output_error
from lightning_hydro.backends.batch_copies import containers_copied
from lightning_hydro.backends.compiled_step import (
    CompiledStep,
    CompileSetting,
    check_compile_setting,
    keep_static,
    mark_static_tensors,
    reduced_precision_step,
)
from lightning_hydro.backends.deferred_metrics import DeferredValue, MetricRecorder, metric_paths
from lightning_hydro.backends.errors import FusionError, FusionMismatchError, explain_step_error
from lightning_hydro.backends.per_trial_values import PerTrialValue
from lightning_hydro.backends.python_state import state_generation
from lightning_hydro.backends.step_state import ActiveCall, StepState
from lightning_hydro.backends.trial_attributes import (
    differing_modes,
    state_writes,
    unfusible_attributes,
    unfusible_error_text,
)
from lightning_hydro.backends.trial_logging import LogCall, LogRecorder, capture_logs, stack_values
from lightning_hydro.backends.trial_ops.functional_patch import trial_functional
from lightning_hydro.backends.trial_readers import ModesReader, SettingsReader, same_settings

if TYPE_CHECKING:
    from lightning_hydro.stacking.stacked_state import StackedState

__all__ = ["MethodCaller", "VmapBackend"]

_Kind = Literal["none", "tensor", "dict"]
_TENSOR = "<tensor>"  # marks a log call whose value is a tensor (returned separately, stacked)


@contextmanager
def _without_mha_fast_path() -> Iterator[None]:
    """nn.MultiheadAttention/TransformerEncoderLayer's C++ fast path (eval mode, no grad) has no vmap rule."""
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(enabled)


class MethodCaller(nn.Module):
    """Makes ``functional_call`` call any method of a module, not just ``forward``.

    Given the buffers handed to ``functional_call`` (keyed ``"module.{name}"``, :func:`call_method`), it also
    returns the buffers the method *reassigned* (``self.count = self.count + 1``; ``self.running_mean = (1 - m) *
    self.running_mean + m * mean`` in a norm layer of one's own), by name, before ``functional_call`` puts the
    module's own tensors back and the new values would be lost; the backend stores them as the group's buffers. A
    change in place (``self.count += 1``, BatchNorm's statistics) reaches the trial's row by itself.
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    @override
    def forward(self, method: str, *args: Any, given: Mapping[str, Tensor] | None = None) -> Any:
        out = getattr(self.module, method)(*args)
        if given is None:
            return out
        return out, reassigned_buffers(self.module, given, method)


def call_method(
    caller: MethodCaller,
    params: dict[str, Tensor],
    buffers: dict[str, Tensor],
    method: str,
    args: tuple[Any, ...],
    *,
    tie_weights: bool = True,
) -> tuple[Any, dict[str, Tensor]]:
    """``caller.module.method(*args)`` under ``functional_call``; returns its output and the buffers it reassigned."""
    if not buffers:  # nothing to reassign (and no check to pay for at every step)
        return functional_call(caller, (params, buffers), (method, *args), tie_weights=tie_weights), {}
    out: tuple[Any, dict[str, Tensor]] = functional_call(
        caller, (params, buffers), (method, *args), {"given": buffers}, tie_weights=tie_weights
    )
    return out


def reassigned_buffers(module: nn.Module, given: Mapping[str, Tensor], method: str) -> dict[str, Tensor]:
    """Each buffer of ``module`` that is no longer the tensor ``given`` for it (``"module.{name}"``), by name.

    Raises:
        FusionError: a buffer was reassigned with another shape or dtype, which its stacked row cannot hold.
    """
    found: dict[str, Tensor] = {}
    for name, buffer in module.named_buffers():
        target = given.get(f"module.{name}")
        if target is None or buffer is target:
            continue
        if buffer.shape != target.shape or buffer.dtype != target.dtype:
            raise FusionError(
                f"{type(module).__name__}.{method} reassigns the buffer {name!r} with shape {tuple(buffer.shape)} and "
                f"dtype {buffer.dtype}, where it had {tuple(target.shape)} and {target.dtype}: the trials' buffers "
                "are stacked, one row per trial, and a row keeps its shape and dtype. Keep them (e.g. "
                f"self.{name.rpartition('.')[2]} = new.to(old.dtype)), or keep the value as a plain attribute."
            )
        found[name] = buffer
    return found


def stepwise_metrics(calls: Sequence[LogCall], method: str) -> list[nn.Module]:
    """The metric objects ``method`` logs with ``on_step=True``: Lightning logs their batch value (forward's).

    Lightning's default is ``on_step=True`` in ``training_step`` only.
    """
    default = method == "training_step"
    return [
        c.value
        for c in calls
        if isinstance(c.value, nn.Module)
        and hasattr(c.value, "compute")
        and (default if c.options.get("on_step") is None else bool(c.options["on_step"]))
    ]


def holds_tied_tensors(module: nn.Module) -> bool:
    """Whether one tensor is reachable under two names of ``module`` (parameters and buffers: tied weights)."""
    seen: set[int] = set()
    named = (*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False))
    for _, tensor in named:
        if id(tensor) in seen:
            return True
        seen.add(id(tensor))
    return False


_PLAIN = frozenset({int, float, bool, str, type(None)})


def _encode(out: Any, method: str) -> tuple[Any, _Kind, tuple[list[str], dict[str, Any]] | None]:
    """Vmap may only return tensors: keep the tensors of what the step returned, remember its shape.

    Returns the tensors, the output's kind, and for a dict with other values (``{"logits": ..., "batch_idx": 3}``)
    its keys in order and those values, which the one template computed for every trial (None: no such values).
    """
    if out is None:
        return (), "none", None
    if isinstance(out, Tensor):
        return out, "tensor", None
    if isinstance(out, Mapping):
        tensors = {k: v for k, v in out.items() if isinstance(v, Tensor)}
        # plain values only (a metric's deferred value or a per-trial stand-in is not every trial's)
        others = {k: v for k, v in out.items() if type(v) in _PLAIN}
        return tensors, "dict", ([k for k in out if k in tensors or k in others], others) if others else None
    raise step_output_error(out, method)


class VmapBackend(Backend):
    """Runs the user's method once, vectorised over the trial rows with ``torch.func.vmap``.

    Args:
        group: the stacked state.
        chunk_size: map this many rows at a time (lower peak memory; None: all at once).
        compile: run ``training_step`` under ``torch.compile`` (see :mod:`.compiled_step`).

    Raises:
        FusionMismatchError: at construction, if the trials differ in Python values that the code run for
            all trials reads (see :mod:`~lightning_hydro.backends.trial_attributes`).
    """

    name = "vmap"

    def __init__(self, group: StackedState, *, chunk_size: int | None = None, compile: CompileSetting = False) -> None:
        super().__init__(group)
        self.chunk_size = chunk_size
        self.compile = check_compile_setting(compile)
        self._compiled: CompiledStep | None = None
        self._caller: MethodCaller | None = None
        self._reassigned: dict[str, Tensor] = {}  # the buffers the latest call reassigned, [B, ...] each
        self._others: tuple[list[str], dict[str, Any]] | None = None  # the latest dict output's other values
        self._recorder: MetricRecorder | None = None
        self._logs = LogRecorder()  # the template's self.log while a call runs (the same object at every call)
        self.deferred_metrics: list[str] = []  # the torchmetrics metrics the last call replayed per trial
        self._state = StepState(self.name)
        self._active: ActiveCall | None = None  # the running call's Python state, read inside the mapped function
        self._ties_key: tuple[MethodCaller, int] | None = None  # (caller, state generation) _ties was found for
        self._ties = True  # whether the template has tied weights (the mapped call reads it)
        self._checked_generation = state_generation()  # the trials' settings are checked just below
        self._settings: SettingsReader | None = None  # reads the trials' settings cheaply (check_settings)
        self._settings_seen: tuple[Any, ...] | None = None  # what it read at the last full check
        self._modes = ModesReader()  # the trials' train/eval modes, read cheaply (check_settings)
        refusal = self.refusal(group.modules, group.trial_ids)
        if refusal is not None:
            try:
                raise refusal
            finally:  # no frame -> error -> traceback -> frame cycle: it would keep the caller's tensors alive
                refusal = None

    def per_trial_settings(self, modules: Sequence[nn.Module]) -> Callable[[str], bool]:
        """For a submodule path: whether its differing Python settings run per trial (never, under vmap)."""
        return lambda path: False

    def refusal(
        self, modules: Sequence[nn.Module], ids: Sequence[int], *, settings_only: bool = False
    ) -> FusionMismatchError | None:
        """The error to raise if these trials differ in Python values that the fused code reads, else None.

        ``settings_only``: only torch's modules' settings and the hparams (see ``unfusible_attributes``).
        """
        honoured = self.per_trial_settings(modules)
        # torchmetrics metrics keep per-trial state by design: their calls are replayed on each trial's own metric
        metrics = [f"{path}." for path in metric_paths(modules[0]).values()]

        def handled(path: str) -> bool:
            return honoured(path) or any(f"{path}.".startswith(prefix) for prefix in metrics)

        found = unfusible_attributes(modules, ids=ids, handled=handled, settings_only=settings_only)
        if not found:
            return None
        return FusionMismatchError(unfusible_error_text(self.name, type(modules[0]).__name__, found))

    def template(self) -> nn.Module:
        """The module whose code runs for every row (subclasses convert it, e.g. into fused operators)."""
        return self.group.modules[0]

    def extra_buffers(self) -> dict[str, Tensor]:
        """Per-row ``[B, ...]`` tensors mapped with the stacked buffers, by the template's buffer names.

        None here; the padded backend maps each row's width mask this way.
        """
        return {}

    @override
    def rebind(self) -> None:
        self._caller = None  # the compiled step stays: a new group size recompiles it once (dynamic shapes)
        self._recorder = None
        self._state.forget()
        self._checked_generation = -1
        self._settings = self._settings_seen = None
        self._modes = ModesReader()

    def check_settings(self) -> bool:
        """After the trials' own code ran (a hook, a loop step): refuse settings that have come to differ.

        Returns whether it checked (False: nothing ran since the last check, or what ran changed no setting).

        A hook may set a torch module's setting per trial (a dropout schedule: ``self.drop.p = ...``); the
        template's would then silently stand for all. The user's own attributes are checked where a step uses
        them (:mod:`~lightning_hydro.backends.step_state`).

        Raises:
            FusionMismatchError: naming the settings that now differ.
        """
        if self._checked_generation == state_generation():
            return False
        self._checked_generation = state_generation()
        differing = modes_refusal(self.group.modules, self.group.trial_ids, self._modes.differing(self.group.modules))
        if differing:
            raise FusionMismatchError(f"FusedLightningModule(backend={self.name!r}): {differing}")
        if self._settings is None:
            self._settings = SettingsReader(self.group.modules)
        seen = self._settings.read(self.group.modules)
        if self._settings_seen is not None and same_settings(seen, self._settings_seen):
            return False  # the trials' code ran (a batch hook) but changed no setting: nothing to check
        self._settings_seen = seen
        refusal = self.refusal(self.group.modules, self.group.trial_ids, settings_only=True)
        if refusal is not None:
            try:
                raise refusal
            finally:  # break the frame -> error -> traceback -> frame cycle
                refusal = None
        return True

    @override
    def run(self, method: str, *args: Any) -> StepOutputs:
        return self._call(method, args, None)[0]

    def run_within(self, step: Callable[..., tuple[Any, Any]], method: str, *args: Any) -> tuple[StepOutputs, Any]:
        """``method`` for every row inside ``step``, which does more with it (the whole step: backward, update).

        ``step(caller, recorder, method, params, buffers, args)`` must call :meth:`vmapped` with these arguments
        (any number of times, e.g. under ``torch.func.grad``) and return what that returned and its own result,
        which comes back beside the step's outputs; a result of None says that nothing ran (then the outputs are
        empty, and the trials' Python state is as before). It is called as it is (compile it yourself).
        """
        return self._call(method, args, step)

    def _call(
        self, method: str, args: tuple[Any, ...], step: Callable[..., tuple[Any, Any]] | None
    ) -> tuple[StepOutputs, Any]:
        self.check_settings()
        # the batch's containers of the call's own: a step that rebinds an entry (batch["x"] = ...) would leave a
        # tensor of vmap's in the loader's batch, which Lightning hands on to the batch-end hooks
        args = containers_copied(args)
        template = self.template()  # every call: subclasses keep their template in step with the trials
        if self._caller is None or self._caller.module is not template:
            self._caller = MethodCaller(template)
            self._recorder = MetricRecorder(template)
        caller, recorder = self._caller, self._recorder
        assert recorder is not None
        self._find_ties(caller)
        params: dict[str, Tensor] = {f"module.{name}": p for name, p in self.group.params.items()}
        buffers = {f"module.{name}": b for name, b in self.group.buffers.items()}
        buffers.update({f"module.{name}": b for name, b in self.extra_buffers().items()})
        call: Callable[..., Any] = self.vmapped
        if step is not None:  # the whole step, which compiles itself
            call = step
            mark_static_tensors(args)
        elif self.compile and method == "training_step":
            if self._compiled is None:
                where = f"backend={self.name!r}, {type(template).__name__}.{method}"
                self._compiled = CompiledStep(self.vmapped, self.compile, where)
                writes = state_writes(template)
                if writes:  # each trial's share of what the step stores is handed out by Python code after the call
                    shown = ", ".join(writes[:4])
                    self._compiled.fall_back(f"the step changes Python state ({shown}), which runs per trial eagerly")
            call = self._compiled
            mark_static_tensors(args)
        active = self._active = self._state.begin(template, self.group.modules, self.group.trial_ids, method)
        try:
            # the stand-ins for self.log and the metrics are installed out here, not in the (compiled) call
            with (
                _without_mha_fast_path(),
                trial_functional(reduced_precision=self._reduced_precision()),
                capture_logs(caller.module, self._logs),
                recorder.recording(),
            ):
                result = call(caller, recorder, method, params, buffers, args)
            extra = None
            if step is not None:
                result, extra = result
            encoded, logged, metric_args, stored, calls, kind = result
        except BaseException as err:
            active.abort()
            if isinstance(err, FusionError) or not isinstance(err, (RuntimeError, ValueError, TypeError, IndexError)):
                raise
            if active.session.refusal:  # torch wrapped our refusal (a stand-in passed where it checks types)
                raise FusionError(active.session.refusal) from err
            # any error the user's code raises under vmap is reported as a FusionError (auto then uses loop)
            explained = explain_step_error(err, method=method, module_name=type(template).__name__, backend=self.name)
            if explained is not None:
                raise explained from err
            raise
        finally:
            self._active = None
        reassigned, self._reassigned = self._reassigned, {}
        if step is not None and extra is None:  # the step did not run (it could not compile): nothing to book
            active.abort()
            return StepOutputs(output=None), None
        active.finish(stored)
        if reassigned:  # new tensors, as alone: the old ones may be saved for the backward pass
            stacked = self.group.buffers
            self.group.replace_buffers({name: v.detach().clone() for name, v in reassigned.items() if name in stacked})
        output = None if kind == "none" else encoded
        # each trial's own torchmetrics metrics, called with its row of what the step passed to the template's
        logged_values = {c.value.call for c in calls if isinstance(c.value, DeferredValue)}
        logged_values |= recorder.calls_of(stepwise_metrics(calls, method))  # their batch values are logged too
        replayed = recorder.replay(metric_args, self.group.modules, needed=logged_values)
        self.deferred_metrics = recorder.metric_names
        logs = self._stack_logs(
            calls, list(logged), method, lambda value: recorder.per_row_value(value, replayed, self.group.modules)
        )
        others, self._others = self._others, None
        per_row = None
        if others is not None and isinstance(output, dict):  # each trial's dict as its step returned it
            keys, values = others
            per_row = [
                {k: output[k][row] if k in output else values[k] for k in keys} for row in range(self.group.size)
            ]
        return StepOutputs(output=output, logs=logs, per_row=per_row), extra

    def _find_ties(self, caller: MethodCaller) -> None:
        """Whether the template holds one tensor under two names (tied weights), which ``functional_call`` must tie.

        Found once per caller and again after the trials' own code ran (a hook may tie weights). Without ties,
        ``functional_call(tie_weights=False)`` does not walk every parameter and buffer of the template at each
        call to look for them.
        """
        key = (caller, state_generation())
        if self._ties_key != key:
            self._ties_key, self._ties = key, holds_tied_tensors(caller)

    def _reduced_precision(self) -> bool:
        """Whether this step may compute in half or mixed precision (autocast on, or half parameters)."""
        return reduced_precision_step(self.group.device, self.group.params.values())

    def stop_compiling(self, reason: str) -> None:
        """Run ``training_step`` eagerly from now on (``reason``: why, said in one log line)."""
        if self.compile and self._compiled is None:
            where = f"backend={self.name!r}, {type(self.template()).__name__}.training_step"
            self._compiled = CompiledStep(self.vmapped, self.compile, where)
        if self._compiled is not None and not self._compiled.failure:
            self._compiled.fall_back(reason)

    @property
    def compiled_step(self) -> CompiledStep | None:
        """The compiled ``training_step`` of the split step (None: not compiled, or not called yet)."""
        return self._compiled

    @property
    def compile_failure(self) -> str:
        """Why ``compile`` fell back to eager (empty if it did not, or compile is off)."""
        return "" if self._compiled is None else self._compiled.failure

    def vmapped(
        self,
        caller: MethodCaller,
        recorder: MetricRecorder,
        method: str,
        params: dict[str, Tensor],
        buffers: dict[str, Tensor],
        args: Any,
    ) -> tuple[Any, tuple[Tensor, ...], tuple[Tensor, ...], tuple[Tensor, ...], list[LogCall], _Kind]:
        """``caller.module.method(*args)`` for every row.

        Returns (stacked output, logged tensors, the tensors of the step's torchmetrics calls, the tensors the
        step stored in Python state, log calls, output kind). A pure function of its inputs (what torch.compile
        compiles); logged tensors come back stacked, and the log calls hold only names, options and non-tensor
        values (a tensor value is :data:`_TENSOR`).
        """
        keep_static(params, buffers)
        side: dict[str, Any] = {}
        tie = self._ties  # found by _call for this caller
        active, logs = self._active, self._logs
        chunked = self.chunk_size is not None and self.chunk_size < self.group.size

        def per_trial(p: dict[str, Tensor], b: dict[str, Tensor]) -> tuple[Any, ...]:
            logs.clear()  # (chunked: this chunk's calls)
            recorder.restart()
            out, reassigned = call_method(caller, p, b, method, args, tie_weights=tie)  # and the buffers it reassigned
            side["reassigned"] = list(reassigned)
            calls = logs.calls
            logs.clear()  # vmap's batched tensors must not leave the mapped function: keep their place, return them
            side["calls"] = [
                LogCall(c.name, _TENSOR if isinstance(c.value, Tensor) else c.value, c.options) for c in calls
            ]
            encoded, side["kind"], side["others"] = _encode(out, method)
            stored: tuple[Tensor, ...] = ()
            if active is not None and not torch.compiler.is_compiling():  # compiled: finish() checks afterwards
                stored = active.collect()
                if chunked and active.touched:
                    raise FusionError(
                        f"backend={self.name!r} with chunk_size={self.chunk_size}: {active.session.where} changes "
                        "Python state, and a chunked call runs the step once per chunk. Use chunk_size=None."
                    )
            logged = tuple(c.value for c in calls if isinstance(c.value, Tensor))
            # one flat tuple out: vmap's own handling of a nested output (out_dims broadcast over it) costs more
            flat, side["spec"] = tree_flatten((encoded, logged, recorder.tensors(), stored, tuple(reassigned.values())))
            return tuple(flat)

        flat = vmap(per_trial, in_dims=(0, 0), randomness="different", chunk_size=self.chunk_size)(params, buffers)
        encoded, logged, metric_args, stored, reassigned = tree_unflatten(list(flat), side["spec"])
        self._reassigned = dict(zip(side["reassigned"], reassigned))  # stored by _call, once the call succeeded
        self._others = side["others"]  # a dict output's values other than tensors, the same for every trial
        return encoded, logged, metric_args, stored, side["calls"], side["kind"]

    def _stack_logs(
        self, calls: list[LogCall], logged: list[Tensor], method: str, per_row: Callable[[Any], Any]
    ) -> list[StackedLog]:
        rows = self.group.size
        logs: list[StackedLog] = []
        tensors = iter(logged)
        for call in calls:
            values = per_row(call.value)  # a metric object or the value metric(...) returned, per trial
            if isinstance(values, list) and values and isinstance(values[0], nn.Module):
                logs.append(StackedLog(call.name, values, call.options))
                continue
            if values is not None:
                logs.append(StackedLog(call.name, stack_values(values, self.group.device), call.options))
                continue
            if isinstance(call.value, str) and call.value == _TENSOR:
                values = next(tensors).detach().reshape(rows, -1)
                if values.shape[1] != 1:
                    raise ValueError(
                        f"self.log({call.name!r}, ...) in {method} got a tensor of {values.shape[1]} elements "
                        "per trial; log a scalar."
                    )
                logs.append(StackedLog(call.name, values.reshape(rows), call.options))
            elif type(call.value) is PerTrialValue and all(
                isinstance(v, (Tensor, int, float)) for v in call.value.trial_values
            ):  # a value that differs between trials, logged: each trial logs its own
                logs.append(
                    StackedLog(call.name, stack_values(call.value.trial_values, self.group.device), call.options)
                )
            elif isinstance(call.value, (int, float)):
                device = self.group.device
                logs.append(StackedLog(call.name, torch.full((rows,), float(call.value), device=device), call.options))
            else:
                raise FusionError(
                    f"backend={self.name!r}: {method} logs {call.name!r} as a {type(call.value).__name__}; under "
                    "vmap only tensors, numbers and the module's own torchmetrics metrics can be logged per trial. "
                    "Log a tensor, or use backend='loop'."
                )
        return logs


def modes_refusal(modules: Sequence[nn.Module], ids: Sequence[int], tops: list[str] | None = None) -> str:
    """What differs between the trials' train/eval modes, and what to do ("" if every submodule's mode agrees).

    ``tops``: what :func:`~lightning_hydro.backends.trial_attributes.differing_modes` says of them, if known.
    """
    tops = differing_modes(modules) if tops is None else tops
    if not tops:
        return ""
    top = tops[0]
    expected = modules[0].get_submodule(top).training
    tid, module = next((t, m) for t, m in zip(ids, modules) if m.get_submodule(top).training != expected)
    mode, other = ("training", "eval") if module.get_submodule(top).training else ("eval", "training")
    shown = ", ".join(repr(p) if p else "the module itself" for p in tops[:4])
    return (
        f"trial {tid}'s {repr(top) if top else 'module'} is in {mode} mode where trial {ids[0]}'s is in {other} "
        f"mode (differing: {shown}); set by the trials' own code (self.freeze() also calls eval(), "
        "module.eval()). One call runs every trial in one mode. Use backend='loop' (backend='auto' hands over "
        "to it), or keep the trials' modes alike (self.train() after self.freeze())."
    )
