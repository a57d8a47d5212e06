"""The two ways hfta fusion can fail: a model it cannot convert, and a fused operator called wrongly."""

import os
import traceback

import torch

import lightning_hydro


class ConversionError(ValueError):
    """Trial modules cannot be converted to hfta fused operators.

    The message names each offending module (path and type), what differs or is unsupported, and the
    backend to use instead.

    Example::

        >>> error = ConversionError("module 'fc' (Linear): trials differ in in_features; use backend='loop'")
        >>> isinstance(error, ValueError)
        True
    """


class FusedCallError(RuntimeError):
    """A fused operator was called in a way it cannot honour.

    For example outside ``torch.func.vmap``, over a different number of trials than it was converted
    for, or with a vmap randomness mode it cannot reproduce.

    Example::

        >>> error = FusedCallError("FusedLinear at 'fc' was converted for 4 trials but vmap runs over 3")
        >>> isinstance(error, RuntimeError)
        True
    """


def failing_user_call(error: BaseException) -> str | None:
    """Where in the user's code ``error`` was raised: ``"file:line in function: source"``, or None.

    vmap refuses some operations only when they run (``.item()``, data-dependent ``if``, in-place
    writes into unbatched tensors). Its traceback already holds the exact call; this picks the innermost
    frame outside torch and lightning_hydro, so an error report can name the user's line.

    Example::

        >>> import torch
        >>> from torch.func import vmap
        >>> def step(x):
        ...     return x * 2 if x.sum().item() > 0 else x
        >>> try:
        ...     vmap(step)(torch.ones(2, 3))
        ... except RuntimeError as error:
        ...     print(failing_user_call(error).split(" in ")[1])
        step: return x * 2 if x.sum().item() > 0 else x
    """
    packages = (torch, lightning_hydro)
    libraries = tuple(os.path.dirname(package.__file__ or "") + os.sep for package in packages)
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if not os.path.abspath(frame.filename).startswith(libraries):
            return f"{frame.filename}:{frame.lineno} in {frame.name}: {(frame.line or '').strip()}"
    return None
