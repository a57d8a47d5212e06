"""Errors of the fusion backends, and the translation of torch.func's vmap errors into actionable ones."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import traceback
import warnings
from collections.abc import Callable

__all__ = [
    "ESCAPED_TENSOR_MESSAGES",
    "FusionError",
    "FusionMismatchError",
    "escaped_tensor_error",
    "explain_backward_error",
    "explain_step_error",
    "explain_vmap_error",
    "name_failed_backward",
    "package_dir",
    "running_user_line",
    "user_frame",
]

# Substrings of torch.func's messages for code that vmap cannot batch, and what the user can do instead.
_VMAP_LIMITS = (
    (".item()", "calls .item() (or float()/int()) on a per-trial tensor"),
    ("data-dependent control flow", "uses a per-trial tensor in Python control flow (if/while on a tensor)"),
    (
        "dynamic shape",
        "uses an operation whose output shape depends on the data (boolean-mask indexing, nonzero)",
    ),
    (
        "inplace arithmetic",
        "updates an unbatched tensor in place with per-trial values (e.g. a torchmetrics "
        "Metric's state, or a Python-side running statistic)",
    ),
    ("Batching rule not implemented", "uses an operation that vmap cannot batch"),
    ("aten::equal", "calls torch.equal, which vmap cannot batch"),
    ("randomness", "draws random numbers in a way vmap's randomness mode forbids"),
)


def package_dir(name: str) -> str | None:
    """The directory of installed package ``name``, found without importing it (Lightning takes seconds)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.abspath(next(iter(spec.submodule_search_locations))) + os.sep


# Frames under these directories are library code, not the user's.
_LIBRARY_DIRS = tuple(
    directory
    for directory in (
        os.path.dirname(os.path.dirname(__file__)) + os.sep,
        package_dir("torch"),
        package_dir("lightning"),
    )
    if directory
)


class FusionError(RuntimeError):
    """The trials cannot run fused with the chosen backend; the message says why and what to use instead."""


class FusionMismatchError(FusionError):
    """Fused trials would compute, or did compute, something other than their own modules do."""


def user_frame(err: BaseException) -> str:
    """``file:line in function: code`` of the innermost traceback frame outside torch, Lightning and us."""
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        if not frame.filename.startswith(_LIBRARY_DIRS) and "<" not in frame.filename:
            code = f": {frame.line.strip()}" if frame.line else ""
            return f"{frame.filename}:{frame.lineno} in {frame.name}{code}"
    return "unknown location"


def running_user_line() -> str:
    """``file:line in function: code`` of the innermost frame of the running stack outside torch, Lightning and us."""
    for frame in reversed(traceback.extract_stack()):
        if not frame.filename.startswith(_LIBRARY_DIRS) and "<" not in frame.filename:
            code = f": {frame.line.strip()}" if frame.line else ""
            return f"{frame.filename}:{frame.lineno} in {frame.name}{code}"
    return "unknown location"


def _in_checkpoint(err: BaseException) -> bool:
    """Whether the error passed through ``torch.utils.checkpoint`` (activation checkpointing)."""
    return any(
        frame.filename.replace(os.sep, "/").endswith("torch/utils/checkpoint.py")
        for frame in traceback.extract_tb(err.__traceback__)
    )


def _checkpoint_error(backend: str, where: str) -> FusionError:
    return FusionError(
        f"backend={backend!r} cannot fuse {where}: it uses activation checkpointing (torch.utils.checkpoint, which "
        "Hugging Face's gradient_checkpointing_enable() switches on), which runs the forward again during "
        "backward, outside torch.func.vmap, where the fused step's per-trial tensors do not exist. Use "
        "backend='loop', which runs each trial's own code (backend='auto' does so by itself), or switch gradient "
        "checkpointing off for the fused trials (it saves memory, which small fused models rarely need)."
    )


# torch's messages when a tensor of a vectorised call is used after it (it "escaped" the transform)
ESCAPED_TENSOR_MESSAGES = ("maybe_level.has_value()", "escaped from inside a function being vmapped")


def explain_backward_error(err: BaseException, *, backend: str, module_name: str) -> FusionError | None:
    """A :class:`FusionError` for an error raised by the backward of a fused step, if fusion caused it; else None."""
    if _in_checkpoint(err):
        return _checkpoint_error(backend, f"{module_name}.training_step")
    if any(needle in str(err) for needle in ESCAPED_TENSOR_MESSAGES):
        return escaped_tensor_error(err, backend=backend, where=f"the backward of {module_name}.training_step")
    return None


def escaped_tensor_error(err: BaseException, *, backend: str, where: str) -> FusionError:
    """The error for a tensor of a vectorised step used after the step (torch's internal assert)."""
    return FusionError(
        f"backend={backend!r}: {where} used a tensor that a fused step computed and kept where lightning_hydro "
        f"cannot hand each trial its own row, at {user_frame(err)}. Attributes, lists, tuples, dicts, sets and "
        "deques of the trial's modules are followed; objects of other classes (and their attributes), globals "
        "and closures are not. Keep such values in an attribute, list or dict of the module, or use "
        "backend='loop', which runs each trial's own code."
    )


def explain_step_error(err: Exception, *, method: str, module_name: str, backend: str = "vmap") -> FusionError | None:
    """A :class:`FusionError` for any error the user's code raised under ``backend``; None if it did not run.

    Activation checkpointing and vmap's own limitations get their specific explanation
    (:func:`explain_vmap_error`). For other errors raised in the user's code (``user_frame`` finds it in the
    traceback) the cause is not known: they may be ordinary bugs, or code that fails only because every tensor
    computed from the parameters carries a trial dimension; an in-place write of a per-trial tensor into a
    tensor shared by all trials is recognised by torch's broadcast message.
    """
    if _in_checkpoint(err):
        return _checkpoint_error(backend, f"{module_name}.{method}")
    explained = explain_vmap_error(err, method=method, module_name=module_name, backend=backend)
    if explained is not None:
        return explained
    where = user_frame(err)
    if where == "unknown location":
        return None  # raised by lightning_hydro or torch outside the user's code: not a fusion failure
    first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
    failed = f"backend={backend!r} failed in {module_name}.{method} at {where}: {type(err).__name__}: {first_line}."
    if "doesn't match the broadcast shape" in first_line:
        return FusionError(
            f"{failed} The step writes a tensor computed from the parameters (which carries a leading trial "
            f"dimension under {backend}) in place into a tensor that all trials share, such as a plain tensor "
            "attribute. Use backend='loop', which runs each trial's own code (backend='auto' does so by itself), or "
            "register that tensor as a buffer (register_buffer), so that each trial has its own row."
        )
    return FusionError(
        f"{failed} lightning_hydro does not recognise this error as one of {backend}'s known limits. Under "
        f"{backend} the step runs once for all trials and every tensor computed from the parameters carries a "
        "leading trial dimension, which code that assumes its own shapes may trip over. Use backend='loop', which "
        "runs each trial's own code one after another (backend='auto' does so by itself); if backend='loop' "
        "raises the same error, the step itself is at fault."
    )


def explain_vmap_error(err: Exception, *, method: str, module_name: str, backend: str = "vmap") -> FusionError | None:
    """A :class:`FusionError` naming the op and the user's line, if ``err`` is a vmap limitation; else None."""
    message = str(err)
    if "vmap" not in message and "Batching rule" not in message and "aten::" not in message:
        return None
    what = next((why for needle, why in _VMAP_LIMITS if needle in message), "does something vmap cannot batch")
    first_line = message.strip().splitlines()[0] if message.strip() else type(err).__name__
    return FusionError(
        f"backend={backend!r} cannot fuse {module_name}.{method}: it {what}, at {user_frame(err)}. "
        f"(torch.func: {first_line}) Use backend='loop', which runs each trial's own code one after another, "
        "or rewrite that line with batched tensor operations."
    )


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


def _anomaly_report(rerun: Callable[[], None]) -> tuple[str, str]:
    """The failing backward node and the user's line that created it, from a rerun under anomaly detection."""
    import torch  # here: this module is imported where torch need not be

    node, where = "", "unknown location"
    with warnings.catch_warnings(record=True) as caught, torch.autograd.detect_anomaly(check_nan=False):
        warnings.simplefilter("always")
        with contextlib.suppress(RuntimeError):
            rerun()
    for warning in caught:
        text = str(warning.message)
        found = re.search(r"Error detected in (\w+)", text)
        if not found:
            continue
        node = found.group(1)
        frames = [
            m for m in _FRAME.finditer(text) if not m.group(1).startswith(_LIBRARY_DIRS) and "<" not in m.group(1)
        ]
        if frames:
            file, line, function, code = frames[-1].groups()
            where = f"{file}:{line} in {function}: {code.strip()}"
    return node, where


def name_failed_backward(
    err: RuntimeError, rerun: Callable[[], None], *, method: str, module_name: str, backend: str = "vmap"
) -> FusionError:
    """A :class:`FusionError` for a fused step whose backward pass failed, naming the op and the user's line.

    For causes :func:`explain_backward_error` does not recognise. ``rerun`` runs the fused forward and backward
    again, under ``torch.autograd.detect_anomaly``, which records where each backward node's forward op was
    called, to name the op and the line that made it.
    """
    node, where = _anomaly_report(rerun)
    first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    op = f"the backward of {node}" if node else "the backward pass"
    others = " or ".join(repr(name) for name in ("vmap", "hfta", "loop") if name != backend)
    return FusionError(
        f"backend={backend!r} cannot differentiate {module_name}.{method}: {op} failed ({first_line}), for the op "
        f"at {where}. Use backend={others} (backend='auto' skips this backend by itself). If "
        "backend='loop' raises the same error, the step itself is at fault."
    )
