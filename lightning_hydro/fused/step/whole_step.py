"""``WholeStep``: with ``compile=``, a steady step's forward, backward, clipping and update as ONE compiled function.

The split step runs three pieces with Lightning between them: the vmapped ``training_step`` (compiled, forward
and backward through AOTAutograd), Lightning's backward, its clipping hook, then the fused optimizer update
(compiled on its own). Each piece returns to Python, and the backward and the hooks run eagerly between them.
Once a group's step is steady, :class:`WholeStep` runs all of it in one function under ``torch.compile``
(``fullgraph=True``): ``torch.func.grad_and_value`` of the sum of the finite losses over the stacked
parameters (the same sum Lightning would run backward on), each row's clipping as the trainer asks, the
non-finite check, and the fused update's device work (:meth:`~.fused_update.FusedUpdate.device_step`). With
``compile="reduce-overhead"`` on a GPU, inductor records that one function as a CUDA graph and replays it
(static inputs: the parameters, the optimizer state, the factors; each new batch is copied in).

Lightning still drives the step: ``training_step`` returns the (detached) loss, the module's ``backward`` and
the group optimizer's clipping and ``step`` see that the whole step has run and only report it; what the
trials logged, their outputs and the rows' health are booked as after a split step.

It runs only where it computes what the split step computes (:meth:`WholeStep.usable`, else the split step
runs, said once per reason): the vmap or hfta backend, settled; the fused optimizer path (one update for all
rows); the parameters that took gradients at the latest split step (a parameter the loss does not reach
takes no step, as with torch's optimizers); no gradient accumulation; 32- or 64-bit precision; one process;
no trial or callback hook that sees the gradients between backward and the update; no Python state written by
the step. What torch.compile cannot capture in one graph falls back to the split step for good, in one log line.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import Tensor
from torch.func import grad_and_value
from torch.utils._pytree import tree_leaves

from lightning_hydro.backends.batch_copies import batch_tensors
from lightning_hydro.backends.compile_check import (
    CHECKED_CALLS,
    RANDOM,
    CheckSchedule,
    eager_again,
    group_mismatch,
    largest,
    rng_states,
    unique_tensors,
)
from lightning_hydro.backends.compiled_step import (
    CompileSetting,
    StepCompiler,
    compile_error,
    keep_static,
    raised_compiling,
    refused_recompile,
)
from lightning_hydro.backends.trial_attributes import state_writes
from lightning_hydro.backends.vmap_backend import VmapBackend
from lightning_hydro.fused.step.fused_update import (
    FusedUpdate,
    checked_values,
    clip_rows_by_norm,
    clip_rows_by_value,
    not_finite,
)
from lightning_hydro.fused.step.row_health import sum_of_finite
from lightning_hydro.optim.group_optimizer import StepReport, clips_by_value

if TYPE_CHECKING:
    from lightning_hydro.backends import Backend, StepOutputs
    from lightning_hydro.optim.group_optimizer import TrialGroupOptimizer

__all__ = ["WHOLE_CHECK_RELATIVE", "WholeStep", "compile_whole_step", "whole_step_blocker"]

log = logging.getLogger("lightning_hydro")

# the hooks that see a step's loss or gradients between the backward and the update: a whole step has no "between"
_BETWEEN_HOOKS = (
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "optimizer_step",
)
_PRECISIONS = ("32-true", "64-true", "32", "64")
# the whole step's checks allow this much of each group's change (the parameters, the buffers, each optimizer
# state; and 1e-6 of its size) as float rounding: looser than the update's own check (1e-3 per tensor), whose
# gradients are the same on both sides, where here the compiled gradients round otherwise
WHOLE_CHECK_RELATIVE = 1e-2


def whole_step_blocker(trainer: Any, trial_hooks: Iterable[str]) -> str:
    """Why this trainer's set-up needs the split step ("" if a whole step may run).

    Args:
        trainer: the Lightning Trainer.
        trial_hooks: the batch hooks the trials override (run per trial between the pieces of a split step).
    """
    between = sorted(set(trial_hooks).intersection(_BETWEEN_HOOKS))
    if between:
        return f"the trials override {', '.join(between)}, which runs between the backward and the update"
    if trainer.accumulate_grad_batches != 1:
        return f"gradients are accumulated over {trainer.accumulate_grad_batches} batches"
    if str(trainer.precision) not in _PRECISIONS:
        return f"precision={trainer.precision!r} (the whole step runs in 32- or 64-bit precision only)"
    if trainer.world_size > 1:
        return f"{trainer.world_size} processes train the group (DDP reduces the gradients during the backward)"
    for callback in trainer.callbacks:
        hooks = [h for h in _BETWEEN_HOOKS if h in type(callback).__dict__]
        if hooks:
            return f"callback {type(callback).__name__} implements {', '.join(hooks)}"
    return ""


def _clip_setting(trainer: Any) -> tuple[str, float]:
    """The trainer's gradient clipping: ("norm" or "value", its value), or ("", 0.0) for none."""
    value = trainer.gradient_clip_val
    if not value:
        return "", 0.0
    return ("value" if clips_by_value(trainer.gradient_clip_algorithm) else "norm"), float(value)


def _whole_step(
    backend: VmapBackend,
    caller: Any,
    recorder: Any,
    method: str,
    params: dict[str, Tensor],
    buffers: dict[str, Tensor],
    args: Any,
    update: FusedUpdate,
    active: list[int],
    names: list[str],
    prior: Tensor,
    clip: tuple[str, float],
    prepared: Any,
    grads_out: list[Tensor] | None = None,
) -> tuple[tuple[Any, ...], tuple[Tensor, ...]]:
    """One step, pure tensor code (what torch.compile compiles): the backend's outputs and the step's masks.

    ``grads_out`` (eager calls only: the first step's check): receives the gradients of the parameters ``active``.
    """
    keep_static(params, buffers, prior, prepared, update.state)  # the batch: marked by the backend's call
    rows = prior.shape[0]
    side: dict[str, Any] = {}

    def total(p: dict[str, Tensor], b: dict[str, Tensor]) -> tuple[Tensor, tuple[Any, ...]]:
        # the buffers are an input (not differentiated): the step may update them in place (BatchNorm's statistics)
        encoded, logged, metric_args, stored, calls, kind = backend.vmapped(caller, recorder, method, p, b, args)
        side["calls"], side["kind"] = calls, kind
        losses = (encoded if kind == "tensor" else encoded["loss"]).reshape(rows)
        bad = not_finite(losses)
        return sum_of_finite(losses, bad), (encoded, logged, metric_args, stored, losses, bad)

    with torch.no_grad():  # the gradients come from grad_and_value; the update is in place
        grads, (summed, (encoded, logged, metric_args, stored, losses, bad)) = grad_and_value(total, has_aux=True)(
            params, buffers
        )
        # torch.func may lay a gradient out with the trial dimension inside (attention's in_proj): make it row-major
        grad_list = [grads[names[i]].contiguous() for i in active]
        if grads_out is not None:
            grads_out.extend(grad_list)
        kind, value = clip
        norms = clip_rows_by_norm(grad_list, value) if kind == "norm" else None
        if kind == "value":
            clip_rows_by_value(grad_list, value)
        by_grads = not_finite(checked_values(grad_list, norms, concatenate=update.concatenate))
        by_loss = bad | prior
        skip = by_loss | by_grads
        update.device_step(update.by_part(active, grad_list), skip, prepared)
    result = (encoded, logged, metric_args, stored, side["calls"], side["kind"])
    return result, (losses, summed, by_loss, by_grads, skip)


def _batch_shapes(batch: Any) -> tuple[Any, ...]:
    """The shapes and dtypes of the batch's tensors (what makes a step of static shapes need a graph of its own)."""
    return tuple((tuple(t.shape), t.dtype) for t in tree_leaves(batch) if isinstance(t, Tensor))


def compile_whole_step(setting: CompileSetting) -> Callable[..., Any]:
    """The whole step under ``torch.compile`` (one graph; ``"reduce-overhead"``: CUDA graphs on a GPU).

    Each call compiles a copy with a code object of its own (:func:`~lightning_hydro.backends.compiled_step.own_code`):
    one group's graphs (one per group size) neither count against another's recompile limit nor outlive it.
    """
    mode = "reduce-overhead" if setting == "reduce-overhead" else None
    return StepCompiler(_whole_step, mode, "the whole step")


class WholeStep:
    """Runs a steady fused step as one compiled function where it computes what the split step does.

    Args:
        setting: the module's ``compile`` (False: never).
    """

    def __init__(self, setting: CompileSetting) -> None:
        self.setting = setting
        self.blocker = ""  # why the trainer's set-up needs the split step (the module sets it for each fit)
        self.clip: tuple[str, float] = ("", 0.0)  # the trainer's clipping
        self.failure = ""  # compiling the whole step failed: every later step is split
        self.reason = "compile is off" if not setting else ""  # why the latest step was split ("" if whole)
        self.whole_steps = 0  # steps run whole (for tests and the report)
        self.losses: Tensor | None = None  # the latest whole step's [B] losses
        self.total: Tensor | None = None  # and the sum of the finite ones (what Lightning sees as the loss)
        self._said: set[str] = set()
        self._compiled: Callable[..., Any] | None = None
        self._names: weakref.WeakKeyDictionary[FusedUpdate, list[str]] = weakref.WeakKeyDictionary()
        self._marked: weakref.WeakSet[FusedUpdate] = weakref.WeakSet()  # updates whose tensors are marked static
        # a new graph is traced only right after a split step has learned which parameters take gradients:
        self._may_trace = True  # the next call may trace one (else a call that needs one runs split first)
        self._relearning = False  # a split step is relearning them (for a step that needed a new graph)
        # and the next batch of the refused batch's shapes may trace one too, once that split step has relearned
        # them as assumed (an epoch's short last batch comes back an epoch later: else it would run split every epoch)
        self._trace_for: set[tuple[Any, ...]] = set()  # batch shapes refused a graph, one use each
        self._assumed: tuple[int, ...] = ()  # the parameters the graphs so far were traced for
        # each update's first whole steps are checked against the same step run eagerly (see _checked_call)
        self._schedule = CheckSchedule(weak=True)
        self.checks = 0  # whole steps checked against eager (for tests and the report)
        self.unchecked = ""  # why the latest check could not compare ("" if it did, or none ran)
        self.worst = 0.0  # the largest error of the checks so far, in units of what float rounding allows (<= 1: same)

    def __getstate__(self) -> dict[str, Any]:
        """Without the compiled function and the caches (``ddp_spawn`` pickles the module): rebuilt on use."""
        state = dict(self.__dict__)
        state["_compiled"], state["_names"], state["_marked"] = None, None, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._names, self._marked = weakref.WeakKeyDictionary(), weakref.WeakSet()

    def configure(self, trainer: Any, trial_hooks: Iterable[str]) -> None:
        """Take the trainer's set-up (at the start of each training epoch: gradient accumulation may change)."""
        self.blocker = whole_step_blocker(trainer, trial_hooks) if self.setting else ""
        self.clip = _clip_setting(trainer)

    def _split_reason(self, backend: Backend, optimizer: TrialGroupOptimizer | None) -> str:
        """Why the next step must be split ("" if it may run whole); called once per step, by :meth:`usable`.

        Not a pure query: it also moves the learned-parameters protocol on (a new update, or a split step that has
        relearned which parameters take gradients, lets the next whole step trace a graph; a changed set makes
        every later step split).
        """
        if not self.setting:
            return "compile is off"
        if self.failure or self.blocker:
            return self.failure or self.blocker
        if not isinstance(backend, VmapBackend):
            return f"backend={backend.name!r} runs each trial's step eagerly"
        if backend.chunk_size is not None:
            return f"chunk_size={backend.chunk_size} maps the rows in chunks"
        if optimizer is None or not isinstance(optimizer.fused, FusedUpdate):
            return "the trials' optimizers step one by one (the universal optimizer path)"
        if optimizer.own_clipping:
            return "a trial clips its gradients its own way"
        if backend.group.frozen:  # (the flags themselves are guarded by dynamo: a change needs a new graph)
            return "some trials have frozen parameters that others train (requires_grad_(False) in their own code)"
        refused = optimizer.fused.why_not_compiled()
        if refused:
            return refused
        if optimizer.fused.last_active is None:
            self._may_trace = True  # a new update (a slot change): its first split step learns, the next traces
            self._trace_for.clear()
            return "the fused update has not stepped yet (its first step learns which parameters take gradients)"
        if self._relearning:  # a split step has just learned them again, for a step that needed a new graph
            self._relearning = False
            learned = tuple(optimizer.fused.last_active)
            if learned != self._assumed:
                self.failure = (
                    f"the parameters that take gradients changed from step to step ({len(self._assumed)} -> "
                    f"{len(learned)} of the update's; one that the loss does not reach takes no optimizer step, and a "
                    "compiled step cannot tell that from a zero gradient)"
                )
                log.warning(
                    "lightning_hydro: compile=%r runs the split step from now on: %s.", self.setting, self.failure
                )
                return self.failure
            self._may_trace = True
        if backend.compile_failure:
            return backend.compile_failure
        writes = state_writes(backend.template())
        if writes:
            return f"the step changes Python state ({', '.join(writes[:4])}), which is handed out per trial eagerly"
        return ""

    def usable(self, backend: Backend, optimizer: TrialGroupOptimizer | None) -> bool:
        """Whether the next step runs whole; if not, the reason is said once in the log."""
        reason = self._split_reason(backend, optimizer)
        self.reason = reason
        if reason and self.setting and reason not in self._said:
            self._said.add(reason)
            log.info(
                "lightning_hydro: compile=%r runs the split step (not one compiled step): %s.", self.setting, reason
            )
        return not reason

    def run(
        self, backend: VmapBackend, optimizer: TrialGroupOptimizer, batch: Any, batch_idx: int, prior: Tensor
    ) -> tuple[StepOutputs, StepReport | None]:
        """One whole step; returns the step's outputs and what the update did (None: compiling failed, nothing ran).

        Args:
            backend: the group's settled backend.
            optimizer: the group optimizer, on the fused path.
            batch: Lightning's batch.
            batch_idx: its index.
            prior: ``[B]`` bool, the rows not to step whatever their loss (a divergence not read back yet).
        """
        update = optimizer.fused
        assert isinstance(update, FusedUpdate)
        assert update.last_active is not None
        group = backend.group
        active = update.last_active
        names = self._names_of(update, group.params)
        prepared = update.prepare([optimizer.trials[tid].optimizer.param_groups for tid in group.trial_ids], active)
        if self.setting == "reduce-overhead":
            self._mark_static(update, group)
            torch.compiler.cudagraph_mark_step_begin()
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = compile_whole_step(self.setting)
        failed: list[str] = []

        needs_graph: list[bool] = []
        shapes = _batch_shapes(batch)
        may_trace = self._may_trace or shapes in self._trace_for
        stance: Literal["default", "fail_on_recompile"] = "default" if may_trace else "fail_on_recompile"
        check = self._schedule.due(update)

        def step(caller: Any, recorder: Any, method: str, params: Any, buffers: Any, args: Any) -> tuple[Any, Any]:
            try:
                with torch.compiler.set_stance(stance):
                    call: tuple[Any, ...] = (backend, caller, recorder, method, params, buffers, args)
                    call += (update, active, names, prior, self.clip, prepared)
                    if check:
                        return self._checked_call(compiled, call, update)
                    return compiled(*call)
            except Exception as err:
                if refused_recompile(err):  # the stance refused a new graph (before anything ran)
                    needs_graph.append(True)
                elif raised_compiling(err):  # raised while tracing or compiling, or by the recompile limit
                    failed.append(f"torch.compile failed ({compile_error(err)})")
                else:
                    raise
            return ((), (), (), (), [], "none"), None

        out, masks = backend.run_within(step, "training_step", batch, batch_idx)
        if masks is None and needs_graph:
            # a new graph (another shape, or a branch of the step's Python): this step runs split and learns which
            # parameters take gradients; the next traces the graph if they are those the graphs so far assume
            self._assumed, self._relearning = tuple(active), True
            self._trace_for.add(shapes)  # used only after the relearning above (else every later step is split)
            self.reason = "the step needs a new graph: a split step learns which parameters take gradients first"
            return out, None
        self._may_trace = False
        self._trace_for.discard(shapes)
        self._assumed = tuple(active)
        if masks is None:
            self.failure = failed[0] if failed else "the whole step returned nothing"
            log.warning("lightning_hydro: compile=%r runs the split step from now on: %s.", self.setting, self.failure)
            return out, None
        update.finish(active, prepared)
        if self.setting == "reduce-overhead":  # a CUDA graph's outputs are overwritten by its next replay
            out, masks = out.cloned(), tuple(m.clone() for m in masks)
        self.losses, self.total, by_loss, by_grads, skip = masks
        self.whole_steps += 1
        report = StepReport(tuple(group.trial_ids), by_loss, by_grads, skipped=skip)
        return out, report

    def _checked_call(self, compiled: Callable[..., Any], call: tuple[Any, ...], update: FusedUpdate) -> Any:
        """One of an update's first whole steps, compiled, then checked against the same step run eagerly.

        Every tensor the step writes (the stacked parameters and buffers, the update's state, counters and factors)
        is copied, and so is the batch (a step may write into it); the compiled step runs; its result is copied, the
        tensors and the random number generators are put back, and :func:`_whole_step` runs eagerly from the same
        state, on the same batch as it came. The eager result is
        kept. If the compiled one differs beyond float rounding (:data:`WHOLE_CHECK_RELATIVE`), compiled code
        computed otherwise than the step it stands for: every later step runs eagerly (the whole step, the split
        step's compiled pieces), said in one log line. A step that draws random numbers (dropout) cannot be
        compared (compiled code draws its own), which is said in the log too.

        Each update's first :data:`~lightning_hydro.backends.compile_check.CHECKED_CALLS` whole steps are checked
        (a new group size or slot change makes a new update): under ``"reduce-overhead"`` on a GPU they are the
        CUDA graph's warm-up, its recording and its first replay. Each check costs one eager step, two copies of
        what the step writes, and one host read. Later replays are not checked.
        """
        backend, group, device = call[0], call[0].group, update.device
        written = unique_tensors([*group.params.values(), *group.buffers.values(), *update.device_tensors(())])
        # the batch too (put back, not compared): a step may write into it (x.mul_(2)), and the eager run must get it
        # as it came, not written twice
        batch = [t for t in unique_tensors(batch_tensors(call[6])) if id(t) not in {id(w) for w in written}]
        before = [t.clone() for t in written]
        batch_before = [t.clone() for t in batch]
        generators = rng_states(device)
        compiled(*call)  # raises before running if it cannot compile: then nothing is checked yet
        number = self._schedule.take(update)
        result = [t.clone() for t in written]
        grads: list[Tensor] = []
        eager_step: Callable[..., Any] = _whole_step  # the same Python, not compiled
        eager, random = eager_again(
            [*written, *batch], [*before, *batch_before], device, generators, lambda: eager_step(*call, grads_out=grads)
        )
        self.checks += 1
        self.unchecked = ""
        if random:
            self.unchecked = RANDOM
            if number == 1:
                log.info("lightning_hydro: compile=%r: the whole step's check: %s.", self.setting, self.unchecked)
            return eager
        position = {id(t): i for i, t in enumerate(written)}
        noise = _noise(update, grads)
        ratios = [
            group_mismatch(
                [before[position[id(t)]] for t in kind],
                [result[position[id(t)]] for t in kind],
                kind,
                relative=WHOLE_CHECK_RELATIVE,
                ignore=[noise.get(id(t)) for t in kind],
            )
            for kind in _kinds(written, group, update)
        ]
        worst = largest(ratios, device)
        self.worst = max(self.worst, worst)
        if worst > 1.0:
            self.failure = (
                f"its compiled step (check {number} of {CHECKED_CALLS}) computed otherwise than the same step run "
                f"eagerly on {device.type} (an error {worst:.3g}x what float rounding allows); the eager result kept"
            )
            log.warning(
                "lightning_hydro: compile=%r runs every step eagerly from now on: %s.", self.setting, self.failure
            )
            backend.stop_compiling(f"the whole step's check: {self.failure}")
            update.stop_compiling(f"the whole step's check: {self.failure}")
        return eager

    def _names_of(self, update: FusedUpdate, params: Mapping[str, Tensor]) -> list[str]:
        """The names, in the backend's call, of the update's parameters (by position)."""
        names = self._names.get(update)
        if names is None:
            by_id = {id(p): f"module.{name}" for name, p in params.items()}
            names = self._names[update] = [by_id[id(p)] for p in update.params]
        return names

    def _mark_static(self, update: FusedUpdate, group: Any) -> None:
        """Mark the tensors the step updates in place static: CUDA graphs read and write them where they are.

        The stacked parameters and buffers, the update's state and factors: none is reallocated between steps (a
        slot change makes new ones, and a new update, marked at the next step; a graph recorded for the old ones is
        recorded again). Once per update, not per step: the steady step walks no tensor list here.
        """
        if update in self._marked:
            return
        self._marked.add(update)
        for tensor in [*group.params.values(), *group.buffers.values(), *update.device_tensors(())]:
            torch._dynamo.mark_static_address(tensor, guard=False)


def _kinds(written: list[Tensor], group: Any, update: FusedUpdate) -> list[list[Tensor]]:
    """``written`` grouped by what each tensor is, each group compared as one.

    The parameters, the buffers, each state of the update (e.g. every parameter's ``exp_avg``), and every other
    tensor (counters, factors) on its own.
    """
    kinds: list[list[Tensor]] = [list(group.params.values()), list(group.buffers.values())]
    names = sorted({name for state in update.state for name in state})
    kinds += [[state[name] for state in update.state if name in state] for name in names]
    seen = {id(t) for kind in kinds for t in kind}
    kinds += [[t] for t in written if id(t) not in seen]
    return [kind for kind in kinds if kind]


def _noise(update: FusedUpdate, grads: list[Tensor]) -> dict[int, Tensor]:
    """By parameter (id): where its gradient is rounding noise, below 1e-3 of its row's RMS gradient.

    Such a gradient is zero in theory (a bias that BatchNorm cancels, attention's key bias): compiled code and eager
    code round it to different tiny values, of either sign, and Adam turns each into a step of the learning
    rate's size, so that the two steps' parameters differ there by design. The check leaves those parameter
    elements out (their optimizer state, which such a gradient barely moves, is still compared).
    """
    params = [update.params[i] for i in update.last_active or ()]
    if not grads or len(grads) != len(params):
        return {}
    rows = grads[0].shape[0]
    precise = torch.float32 if grads[0].device.type == "mps" else torch.float64
    squares = torch.stack([g.to(precise).reshape(rows, -1).square().sum(1) for g in grads]).sum(0)
    count = sum(g[0].numel() for g in grads)
    floor = 1e-3 * (squares / count).sqrt()  # [B]
    return {id(p): g.abs().to(precise) <= floor.view(-1, *([1] * (g.dim() - 1))) for p, g in zip(params, grads)}
