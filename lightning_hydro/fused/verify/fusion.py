"""Fusion is verified, not assumed: compare each trial's fused output with its own module's output.

vmap runs one template module's Python code for every trial. Differing plain values that this code reads
are refused when the backend is built (:mod:`lightning_hydro.backends.trial_attributes`); this first-batch
check catches the rest (state in objects the scan cannot compare) by comparing each trial's fused loss and
gradients with its own module's. The tolerance follows the arithmetic: float rounding of two correct
float32 computations (another reduction order, another thread count) is measured against a float64 run
of the trial's own step, and a floor of ``eps * sqrt(n) * |value|`` (n: the reduction size) covers a lucky
float32 run. Rounding can also flip a discontinuity (a pre-activation within rounding of a ReLU's kink, a
tie in a max): one unit's gradient then jumps far beyond rounding although both computations are correct.
So a float32 difference is only reported if it persists when the fused step itself runs in float64 (on a
float64 copy of the group), where such flips are ~1e9 times rarer; a real difference (another smoothing,
temperature, mask) persists.

When the check fails, the error names the plain values that differ between the trials
(:func:`~lightning_hydro.backends.trial_attributes.scan_attributes`) and the values it cannot compare.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.func import functional_call

from lightning_hydro.backends.batch_copies import tensors_copied
from lightning_hydro.backends.compiled_step import eager_calls
from lightning_hydro.backends.errors import FusionMismatchError, explain_backward_error, name_failed_backward
from lightning_hydro.backends.python_state import PythonState, copy_template
from lightning_hydro.backends.trial_attributes import scan_attributes, uncompared_reads
from lightning_hydro.backends.trial_logging import capture_logs
from lightning_hydro.backends.vmap_backend import MethodCaller
from lightning_hydro.fused.verify.python_arguments import check_python_arguments

_log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from lightning_hydro.backends.base import Backend
    from lightning_hydro.stacking.stacked_state import StackedState

__all__ = ["FusionMismatchError", "verify_fusion"]


def _differing_attribute_texts(modules: Sequence[nn.Module], *, ids: Sequence[int]) -> list[str]:
    """What the removed ``lightning_hydro.fused.verify.differing_attributes`` returned (kept for one release)."""
    return [str(attribute) for attribute in scan_attributes(modules, ids=ids)]


@contextmanager
def _restored(state: _StepState) -> Iterator[None]:
    try:
        yield
    finally:
        state.restore()


class _StepState:
    """The trials' Python state and the group's buffers as they were, put back by :meth:`restore`."""

    def __init__(self, python: PythonState, group: StackedState) -> None:
        self.python = python
        self.group = group
        self.buffers = group.saved_buffers()

    def restore(self) -> None:
        """Put the Python state and the buffers back as they were when this was made."""
        self.python.restore()
        self.group.restore_buffers(self.buffers)  # (a trial's own step may have reassigned its view of the row)


@contextmanager
def _eval_mode(modules: Sequence[nn.Module]) -> Iterator[None]:
    modes = [(m, m.training) for module in modules for m in module.modules()]
    try:
        for module in modules:
            module.eval()
        yield
    finally:
        for m, mode in modes:
            m.training = mode


def _loss(output: Any) -> Tensor | None:
    return output.get("loss") if isinstance(output, dict) else output


# Two correct float32 computations of one value differ by float rounding; a fused value is called different
# only beyond this many times the rounding measured (or the eps * sqrt(n) floor): real mismatches (a
# differing smoothing, temperature, mask) are orders of magnitude larger.
_SAFETY = 16.0


@dataclass
class Comparison:
    """One compared value (the loss or a gradient) of one trial, with the numbers behind the verdict."""

    what: str
    difference: float  # |fused - own|
    own_norm: float
    rounding: float | None  # |own float32 - own float64|, or None without a float64 run
    floor: float  # eps * sqrt(n) * |own|
    fused_value: float | None = None  # for a scalar loss
    own_value: float | None = None

    @property
    def tolerance(self) -> float:
        """``_SAFETY`` times the larger of the measured rounding and the floor."""
        return _SAFETY * max(self.rounding or 0.0, self.floor)

    @property
    def differs(self) -> bool:
        """Whether the difference is beyond float rounding (non-finite differences always are)."""
        return not math.isfinite(self.difference) or self.difference > self.tolerance

    def describe(self) -> str:
        """The numbers, e.g. ``gradient of head.weight: |fused - own| = 3e-02 > tolerance 4e-06 (...)``."""
        rounding = "no float64 run" if self.rounding is None else f"float32 rounding {self.rounding:.2e}"
        text = (
            f"{self.what}: |fused - own| = {self.difference:.3e} > tolerance {self.tolerance:.3e} "
            f"({_SAFETY:g} x max({rounding}, eps*sqrt(n)*|own| = {self.floor:.2e}); |own| = {self.own_norm:.4g})"
        )
        if self.fused_value is not None and self.own_value is not None:
            text += f"; fused {self.fused_value!r} vs own {self.own_value!r}"
        return text


def compare(what: str, fused: Tensor, own: Tensor, reference: Tensor | None, *, reduction: int) -> Comparison:
    """Compare a fused value with the trial's own, in float64, against float rounding.

    Args:
        what: a name for the message.
        fused: the fused value of this trial.
        own: the trial's own module's value (same dtype as ``fused``).
        reference: the same value from a float64 run of the trial's own step, if there is one.
        reduction: the number of terms summed into one element (the floor grows as its square root).

    Example::

        >>> own = torch.tensor([1.0, 2.0])
        >>> compare("loss", own + 1e-6, own, own.double(), reduction=64).differs
        False
        >>> compare("loss", own * 1.01, own, own.double(), reduction=64).differs
        True
    """
    f, o = fused.detach().double(), own.detach().double()
    eps = torch.finfo(own.dtype).eps if own.is_floating_point() else 0.0
    scalar = own.numel() == 1
    finite = torch.isfinite(o)
    # where the trial's own value is inf/NaN (a diverging trial), the fused one must be so too; isolation
    # handles the divergence. Elsewhere the finite values are compared.
    difference = math.inf if not torch.equal(torch.isfinite(f), finite) else float((f[finite] - o[finite]).norm())
    rounding = None
    if reference is not None:
        r = reference.detach().double().to(o.device)
        rounding = float((o[finite] - r[finite]).norm())
        rounding = rounding if math.isfinite(rounding) else None
    own_norm = float(o[finite].norm())
    return Comparison(
        what,
        difference,
        own_norm,
        rounding,
        eps * math.sqrt(max(reduction, 1)) * own_norm,
        float(f.reshape(())) if scalar else None,
        float(o.reshape(())) if scalar else None,
    )


def _to_double(value: Any) -> Any:
    if isinstance(value, Tensor):
        return value.double() if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        return type(value)(_to_double(v) for v in value)
    if isinstance(value, dict):
        return {k: _to_double(v) for k, v in value.items()}
    return value


def _float64_run(
    module: nn.Module, names: Sequence[str], batch: Any, batch_idx: int
) -> tuple[Tensor | None, list[Tensor | None], str]:
    """The trial's own loss and gradients in float64 (default dtype too), or Nones and the reason."""
    caller = MethodCaller(module)
    params = {f"module.{n}": module.get_parameter(n).detach().double().requires_grad_(True) for n in names}
    buffers = {f"module.{n}": _to_double(b.detach()) for n, b in module.named_buffers()}
    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        with capture_logs(module):
            loss = _loss(
                functional_call(
                    caller, (params, buffers), ("training_step", _to_double(tensors_copied(batch)), batch_idx)
                )
            )
        if loss is None:
            return None, [None] * len(names), "the float64 run returned no loss"
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        return loss, list(grads), ""
    except Exception as err:  # code that insists on float32 somewhere: fall back to the floor alone
        return None, [None] * len(names), f"no float64 run ({type(err).__name__}: {str(err)[:80]})"
    finally:
        torch.set_default_dtype(default)


def _float64_fused_run(
    group: StackedState, backend: Backend, names: Sequence[str], batch: Any, batch_idx: int
) -> tuple[Tensor, list[Tensor | None]] | str:
    """The fused loss and gradients of a float64 copy of the group on the same backend, or why there are none.

    The copy is built from deep copies of the trial modules (the group itself, its ``.grad`` and its random
    state are not touched), so it costs one more fused step; it runs only when the float32 check failed.
    """
    from lightning_hydro.backends import make_backend  # the backends' registry imports this module's peers
    from lightning_hydro.stacking.stacked_state import StackedState

    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        copies = [copy_template(m).double() for m in group.modules]  # not the tensors its outputs lists hold
        for twin_module in copies:  # the group's flags: rows a trial froze are stacked with the others
            for name, param in group.params.items():
                twin_module.get_parameter(name).requires_grad_(param.requires_grad)
        twin = StackedState(nn.Module(), copies, group.trial_ids, pad_widths=group.pad_widths)
        result = make_backend(backend.name, twin).run("training_step", _to_double(tensors_copied(batch)), batch_idx)
        loss = result.loss()
        if loss is None:
            return "the float64 fused run returned no loss"
        stacked = [twin.params[name] for name in names]
        return loss, list(torch.autograd.grad(loss.sum(), stacked, allow_unused=True))
    except Exception as err:  # code that insists on float32 somewhere: the float32 verdict stands
        return f"no float64 fused run ({type(err).__name__}: {str(err)[:80]})"
    finally:
        torch.set_default_dtype(default)


def _persists_in_float64(
    fused64: tuple[Tensor, list[Tensor | None]],
    row: int,
    names: Sequence[str],
    ref_loss: Tensor | None,
    ref_grads: Sequence[Tensor | None],
    reduction: int,
    group: StackedState,
    trains: Sequence[bool],
) -> list[Comparison]:
    """The comparisons in which the float64 fused run differs from the trial's own float64 run.

    ``group`` cuts each padded row to the trial's own width (the float64 twin has the same shapes); ``trains``: by
    name, whether the trial trains the parameter (one it froze is not compared).
    """
    loss, grads = fused64
    found = [] if ref_loss is None else [compare("loss (float64)", loss[row], ref_loss, None, reduction=reduction)]
    for name, f, r, t in zip(names, grads, ref_grads, trains):
        if t and f is not None and r is not None:
            own_width = group.trial_view(name, row, f[row])
            found.append(compare(f"gradient of {name} (float64)", own_width, r, None, reduction=reduction))
    return [c for c in found if c.differs]


def _reduction_size(batch: Any, stacked: Sequence[Tensor]) -> int:
    """Terms summed into one element, at most: batch size times the widest parameter dimension."""
    first = next((t for t in _tensors(batch)), None)
    batch_size = int(first.shape[0]) if first is not None and first.dim() else 1
    widest = max((max(t.shape[1:], default=1) for t in stacked), default=1)
    return batch_size * int(widest)


def _tensors(value: Any) -> Iterator[Tensor]:
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _fused_gradients(
    fused: Tensor, backend: Backend, stacked: Sequence[Tensor], batch: Any, batch_idx: int, module_name: str
) -> tuple[Tensor | None, ...]:
    """The fused step's gradients; a backward pass that fails is a FusionError naming the op and the line."""
    try:
        return torch.autograd.grad(fused.sum(), stacked, allow_unused=True)
    except RuntimeError as err:
        known = explain_backward_error(err, backend=backend.name, module_name=module_name)  # e.g. checkpointing
        if known is not None:
            raise known from err

        def rerun() -> None:
            loss = backend.run("training_step", tensors_copied(batch), batch_idx).loss()
            if loss is not None:
                torch.autograd.grad(loss.sum(), stacked, allow_unused=True)

        raise name_failed_backward(
            err, rerun, method="training_step", module_name=module_name, backend=backend.name
        ) from err


def verify_fusion(group: StackedState, backend: Backend, ids: Sequence[int], batch: Any, batch_idx: int) -> bool:
    """Compare each trial's fused ``training_step`` loss and gradients with its own module's.

    Runs in eval mode (no dropout, no BatchNorm statistics updates), in full precision, on a forked random
    number generator, without touching any ``.grad``, from the trials' Python state as it was, which every run
    leaves as it found it. Gradients are compared because a loss alone can hide a
    difference (label smoothing barely changes the loss of an untrained, near-uniform classifier, but changes
    its gradient). A value differs when ``|fused - own|`` exceeds 16 times the float rounding measured
    against a float64 run of the trial's own step (or ``eps * sqrt(n) * |own|``, if larger), and the fused
    step run in float64 still differs from the trial's own float64 step (a float32-only difference is rounding
    that flipped a discontinuity, such as a ReLU's kink). Then, in training mode, the Python values the step
    hands to torch are compared (:mod:`.python_arguments`: a dropout rate is invisible in eval mode).

    Returns:
        False if the step returned no loss for this batch (check again on the next one).

    Raises:
        FusionMismatchError: naming the trial, the numbers, and the state the step reads that may differ.
    """
    modules = list(group.modules)
    # the parameters that train: a frozen part (a fine-tuned backbone's requires_grad_(False)) has no gradient
    names = [name for name, param in group.params.items() if param.requires_grad]
    stacked = [group.params[name] for name in names]
    device = stacked[0].device
    reduction = _reduction_size(batch, stacked)
    # every run starts from the trials' Python state and buffers as they were, and none leaves a trace in them (a
    # step that counts in a buffer, self.seen += 1, would count each check run: the buffers are the group's own)
    state = _StepState(PythonState(modules), group)
    # in full precision: under bf16 autocast two correct computations already differ at the 1e-2 level
    with (
        _eval_mode(modules),
        torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
        torch.autocast(device.type, enabled=False),
        _restored(state),
        eager_calls(),  # compile=: not worth a graph of its own (eval mode, full precision) for one check
    ):
        fused = backend.run("training_step", tensors_copied(batch), batch_idx).loss()
        if fused is None:
            return False
        # the gradients before the restore (as for each trial's own run below): the backward pass may read buffers
        # the step moved (BatchNorm statistics, once the step puts the module back in train mode)
        fused_grads = _fused_gradients(fused, backend, stacked, batch, batch_idx, type(modules[0]).__name__)
        state.restore()
        fused64: tuple[Tensor, list[Tensor | None]] | str | None = None  # made once, if a float32 check fails
        for tid in ids:
            row = group.row_of(tid)
            module = modules[row]
            with capture_logs(module):
                own = _loss(module.training_step(tensors_copied(batch), batch_idx))  # type: ignore[operator]
            assert own is not None
            # of those, the trial's own: one it froze in its own code (gradual unfreezing) has no gradient alone
            trains = [module.get_parameter(name).requires_grad for name in names]
            own_params = [module.get_parameter(name) for name, t in zip(names, trains) if t]
            # before the restore: a step that puts BatchNorm back in train mode (self.train()) moved the running
            # statistics its backward pass reads, and writing them back first would fail that pass
            taken = iter(torch.autograd.grad(own, own_params, allow_unused=True))
            own_grads = [next(taken) if t else None for t in trains]
            state.restore()
            ref_loss, ref_grads, why = _float64_run(module, names, batch, batch_idx)
            state.restore()
            found = [compare("loss", fused[row], own, ref_loss, reduction=reduction)]
            unused: list[str] = []
            for name, f, o, r, t in zip(names, fused_grads, own_grads, ref_grads, trains):
                if not t:
                    continue  # frozen by this trial: its row's fused gradient is dropped (StackedState.frozen)
                if (f is None) != (o is None):
                    unused.append(name)
                elif f is not None and o is not None:
                    fused_grad = group.trial_view(name, row, f[row])  # the trial's own width of a padded row
                    found.append(compare(f"gradient of {name}", fused_grad, o, r, reduction=reduction))
            differing = [c for c in found if c.differs]
            if differing and not unused and ref_loss is not None:
                if fused64 is None:
                    fused64 = _float64_fused_run(group, backend, names, batch, batch_idx)
                    state.restore()
                if isinstance(fused64, str):
                    why = f"{why}; {fused64}" if why else fused64
                else:
                    confirmed = _persists_in_float64(fused64, row, names, ref_loss, ref_grads, reduction, group, trains)
                    if not confirmed:  # rounding flipped a discontinuity in one float32 run: not a mismatch
                        _log.info(
                            "First-batch check: trial %d's float32 difference (%s) vanishes when the fused step "
                            "runs in float64: float rounding at a discontinuity (e.g. a ReLU kink), not a mismatch.",
                            tid,
                            differing[0].describe(),
                        )
                        continue
                    first = confirmed[0]
                    persisting = (
                        f"the float64 fused run differs too ({first.what}: |fused - own| = {first.difference:.3e} > "
                        f"{first.tolerance:.3e})"
                    )
                    why = f"{why}; {persisting}" if why else persisting
            if differing or unused:
                raise FusionMismatchError(_mismatch_text(backend.name, tid, differing, unused, why, group))
    check_python_arguments(group, backend, ids, batch, batch_idx)  # training mode: what eval mode cannot show
    return True


def _mismatch_text(
    backend: str, tid: int, differing: list[Comparison], unused: list[str], why: str, group: StackedState
) -> str:
    numbers = "; ".join(c.describe() for c in differing[:3])
    if unused:
        numbers += f"; gradients present in one run only: {', '.join(unused[:5])}"
    if why:
        numbers += f" ({why})"
    modules = list(group.modules)
    suspects = uncompared_reads(modules)
    attrs = scan_attributes(modules, ids=group.trial_ids)
    read = [str(a) for a in attrs if a.read]
    unread = [a.qualified_name for a in attrs if not a.read]
    if read or suspects:
        hint = "suspects: " + "; ".join([*read, *(f"{s} (not comparable, read by the step)" for s in suspects)][:10])
    else:
        hint = (
            "no Python value that the step reads differs between trials; look for state it reads that is not a "
            "parameter or buffer (globals, closures, objects reached through other objects)"
        )
    if unread:
        hint += f". Not suspects (they differ, but the fused code does not read them): {', '.join(unread[:10])}"
    return (
        f"FusedLightningModule(backend={backend!r}): trial {tid}'s fused training_step differs from its own "
        f"module's beyond float rounding: {numbers}. {backend} runs one template module's code for every trial; "
        f"{hint}. Use backend='loop', or make the differing value a parameter or buffer."
    )
