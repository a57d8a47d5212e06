"""The first-batch check in training mode: the Python values the user's code hands to torch, fused and alone.

The numeric first-batch check (:mod:`.fusion`) runs in eval mode, where dropout is off, so a dropout rate that
differs between trials and that the user's code hands to a functional op itself (Hugging Face GPT-2 and BERT,
timm's ViT: ``F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_dropout.p if self.training else 0.0)``)
is invisible to it. This check runs the step in training mode, once fused and once per trial on its own module,
and records every call that the user's own code (not torch's or Lightning's) makes to a torch function or tensor
method, with the floats, bools, strings and Nones it passes (sizes are left out: a padded group's differ by
design). The fused step runs the first trial's code for every trial, so its calls carry the first trial's
values: where a trial's own step passes another value, or calls other functions (Python control flow on a value
that differs), that trial would silently compute something else fused. The static scan of
:mod:`~lightning_hydro.backends.trial_attributes` catches most of these before anything runs; this check catches
the values it cannot compare (a config object's fields, say).

It runs without gradients, on a forked random number generator and the Python ``random`` state, and puts back
buffers (BatchNorm statistics) and the trials' Python state afterwards.
"""

from __future__ import annotations

import inspect
import os
import random
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import CodeType
from typing import TYPE_CHECKING, Any

import torch
from torch.overrides import TorchFunctionMode

from lightning_hydro.backends.batch_copies import tensors_copied
from lightning_hydro.backends.errors import FusionMismatchError, package_dir
from lightning_hydro.backends.python_state import PythonState
from lightning_hydro.backends.trial_logging import capture_logs
from lightning_hydro.backends.trial_ops.functional_patch import is_rule_frame, standing_in
from lightning_hydro.backends.vmap_backend import VmapBackend

if TYPE_CHECKING:
    from lightning_hydro.backends.base import Backend
    from lightning_hydro.stacking.stacked_state import StackedState

__all__ = ["ArgumentCall", "check_python_arguments", "recorded_arguments"]

# lightning_hydro/ (this file is lightning_hydro/fused/verify/python_arguments.py)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep
# torchmetrics' code runs after the fused step (its calls are replayed per trial), so it is not compared
_LIBRARIES = (*(d for d in map(package_dir, ("torch", "lightning", "torchmetrics")) if d), _PACKAGE)
_USER_INSIDE = (os.path.join(_PACKAGE, "demos") + os.sep,)  # our demo modules are user code too
_RECORDED = (float, bool, str, type(None))


@dataclass(frozen=True)
class ArgumentCall:
    """One call of a torch function by the user's code: the function, the line, the recorded arguments."""

    function: str
    where: str
    arguments: tuple[tuple[str, Any], ...]


def _code(function: Any) -> CodeType:
    code: CodeType = inspect.unwrap(function).__code__
    return code


def _comparable(value: Any) -> Any:
    return "nan" if isinstance(value, float) and value != value else value  # NaN equals NaN here


def _is_user(filename: str) -> bool:
    if "<" in filename:
        return False
    return not filename.startswith(_LIBRARIES) or filename.startswith(_USER_INSIDE)


class _Recorder(TorchFunctionMode):
    def __init__(self, step: CodeType) -> None:
        super().__init__()
        from lightning_hydro.backends.hfta.trial_grouped_module import TrialGroupedModule

        self.calls: list[ArgumentCall] = []
        self._step = step
        self._overrides = sys.modules["torch.overrides"].__file__
        # hfta runs a module whose settings differ once per group of equal settings, each with its own: not compared
        self._grouped = TrialGroupedModule.forward.__code__
        # the user's torch.autograd.Function code, found once per recording (see _inside_step)
        self._functions = _autograd_function_codes()

    def _inside_step(self, frame: Any) -> bool:
        """Whether the frame runs inside the user's step (and not inside one of hfta's per-group modules).

        Not inside a ``torch.autograd.Function`` of the user's either: under vmap its ``forward`` runs where torch
        function modes are not seen (``generate_vmap_rule``), so only the trial's own run would record its calls.
        """
        while frame is not None:
            if frame.f_code is self._grouped or frame.f_code in self._functions:
                return False
            if frame.f_code is self._step:
                return True
            frame = frame.f_back
        return False

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        # torch's Python functions dispatch under their module-level name, which may be a trial rule's wrapper
        code = getattr(getattr(func, "__lightning_hydro_original__", func), "__code__", None)
        frame: Any = sys._getframe(1)
        # skip torch's dispatch (handle_torch_function) and the Python function itself (F.dropout's own body)
        # and a trial rule's wrapper, which hands the mode the original function (backends/trial_ops)
        while frame is not None and (
            frame.f_code.co_filename == self._overrides or frame.f_code is code or is_rule_frame(frame.f_code)
        ):
            frame = frame.f_back
        if frame is not None and _is_user(frame.f_code.co_filename) and self._inside_step(frame):
            recorded = tuple((str(i), _comparable(v)) for i, v in enumerate(args) if isinstance(v, _RECORDED))
            recorded += tuple((k, _comparable(v)) for k, v in kwargs.items() if isinstance(v, _RECORDED))
            name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or str(func)
            where = f"{frame.f_code.co_filename}:{frame.f_lineno}"
            self.calls.append(ArgumentCall(name, where, recorded))
        return standing_in(func)(*args, **kwargs)


_FUNCTION_CODES: tuple[int, frozenset[CodeType]] = (-1, frozenset())  # (how many subclasses, their codes)


def _autograd_function_codes() -> frozenset[CodeType]:
    """The code of each ``forward``, ``setup_context``, ``backward`` of the ``torch.autograd.Function`` subclasses."""
    global _FUNCTION_CODES
    classes: list[type] = []
    pending: list[type] = [torch.autograd.Function]
    while pending:
        subclasses: list[type] = pending.pop().__subclasses__()
        classes += subclasses
        pending += subclasses
    if _FUNCTION_CODES[0] != len(classes):
        codes: set[CodeType] = set()
        for cls in classes:
            for name in ("forward", "setup_context", "backward", "jvp", "vmap"):
                member = vars(cls).get(name)
                code = getattr(getattr(member, "__func__", member), "__code__", None)
                if isinstance(code, CodeType):
                    codes.add(code)
        _FUNCTION_CODES = (len(classes), frozenset(codes))
    return _FUNCTION_CODES[1]


@contextmanager
def recorded_arguments(step: CodeType) -> Iterator[list[ArgumentCall]]:
    """Record the torch calls the user's code makes inside the function of code ``step`` (the module docstring)."""
    recorder = _Recorder(step)
    with recorder:
        yield recorder.calls


def _first_difference(fused: Sequence[ArgumentCall], own: Sequence[ArgumentCall]) -> str | None:
    for index, (f, o) in enumerate(zip(fused, own)):
        if (f.function, f.where) != (o.function, o.where):
            return (
                f"the fused step's call {index + 1} is {f.function} at {f.where}, the trial's own is {o.function} at "
                f"{o.where}: the Python code takes another path (control flow on a value that differs between trials)"
            )
        if f.arguments != o.arguments:
            fused_args, own_args = dict(f.arguments), dict(o.arguments)
            changed = [key for key in {**fused_args, **own_args} if fused_args.get(key) != own_args.get(key)]
            shown = "; ".join(
                f"argument {key}: trial's own {own_args.get(key)!r}, fused {fused_args.get(key)!r}" for key in changed
            )
            return f"at {o.where} it hands {o.function} other values ({shown})"
    if len(fused) != len(own):
        return (
            f"the fused step makes {len(fused)} torch calls from your code, the trial's own {len(own)}: the Python "
            "code takes another path (control flow on a value that differs between trials)"
        )
    return None


def check_python_arguments(
    group: StackedState, backend: Backend, ids: Sequence[int], batch: Any, batch_idx: int
) -> None:
    """Compare the Python values each trial's own ``training_step`` hands to torch with the fused step's.

    Runs in the modules' current (training) mode. See the module docstring.

    Raises:
        FusionMismatchError: naming the trial, the function, the line, and both values.
    """
    modules = list(group.modules)
    device = group.device
    saved_buffers = group.saved_buffers()
    state = PythonState(modules)
    python_random = random.getstate()
    try:
        with (
            torch.no_grad(),
            torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
            torch.autocast(device.type, enabled=False),
        ):
            step = _code(type(modules[0]).training_step)  # type: ignore[attr-defined]
            if isinstance(backend, VmapBackend):  # its own preparation (a conversion copies modules) not recorded
                backend.check_settings()
                backend.template()
            with recorded_arguments(step) as fused:
                backend.run("training_step", tensors_copied(batch), batch_idx)
            for tid in ids:
                state.restore()
                random.setstate(python_random)
                module = modules[group.row_of(tid)]
                with capture_logs(module), recorded_arguments(step) as own:
                    module.training_step(tensors_copied(batch), batch_idx)  # type: ignore[operator]
                difference = _first_difference(fused, own)
                if difference is not None:
                    raise FusionMismatchError(
                        f"FusedLightningModule(backend={backend.name!r}): in training mode, trial {tid}'s own "
                        f"training_step differs from the fused one: {difference}. {backend.name} runs one template "
                        "module's code for every trial, so this trial would silently compute with the first "
                        "trial's values (e.g. its dropout rate). Use backend='loop' (backend='auto' does so by "
                        "itself), or give every trial the same value."
                    )
    finally:
        random.setstate(python_random)
        state.restore()
        group.restore_buffers(saved_buffers)  # (a trial's own step may have reassigned its view of the row)
