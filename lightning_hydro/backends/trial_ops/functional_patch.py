"""The trial rules installed in ``torch.nn.functional`` while a fused vmap step runs, and only then.

Why patch ``torch.nn.functional``: the ops that vmap batches badly (see :mod:`.attention`,
:mod:`.normalization`, :mod:`.autocast_policy`) are reached through it by user code (``F.layer_norm(...)``)
and by torch's own modules, whose Python code looks the function up in that module at call time
(``nn.Linear`` calls ``F.linear``, ``nn.MultiheadAttention`` calls ``scaled_dot_product_attention`` from
inside ``F.multi_head_attention_forward``). A ``TorchFunctionMode`` would see the user's calls but not the
calls inside ``F.multi_head_attention_forward`` (a mode is switched off while it handles a call), and it
would add a Python call to every op of the step.

What it changes: inside :func:`trial_functional` each listed function is replaced by a wrapper that calls the
original unchanged unless one of its tensor arguments is mapped over by vmap; so any other code running
meanwhile (another thread, a fused operator's own calls, the verification of the first batch) computes
exactly as before. The originals are put back when the outermost :func:`trial_functional` exits, however
it exits. Code that imported a function by name (``from torch.nn.functional import linear``) keeps the
original: there vmap's own batching runs, as without these rules. So does a step under ``torch.compile``
(``compile=True``): dynamo traces an autograd Function's ``forward``, not the vmap rule that the rules are
made of, so the wrappers hand compiled code to the originals.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import has_torch_function

from lightning_hydro.backends.trial_ops.attention import attention_rule
from lightning_hydro.backends.trial_ops.autocast_policy import autocast_policy, cast_for_autocast
from lightning_hydro.backends.trial_ops.normalization import batch_norm_rule, group_norm_rule, layer_norm_rule
from lightning_hydro.backends.trial_ops.projection import convolution_rule, linear_rule

__all__ = ["ALWAYS", "RULES", "is_rule_frame", "reduced_precision", "standing_in", "trial_functional", "wrap_with_rule"]

Rule = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]

# torch.nn.functional's name -> the rule that runs it for every trial (None: only autocast's cast policy)
RULES: dict[str, Rule | None] = {
    "scaled_dot_product_attention": attention_rule,
    "batch_norm": batch_norm_rule,
    "group_norm": group_norm_rule,
    "layer_norm": layer_norm_rule,
    "linear": linear_rule,
    "conv1d": convolution_rule,
    "conv2d": convolution_rule,
    "conv3d": convolution_rule,
}
# Rules needed in float32 too (attention: torch's batching picks kernels that fail on CUDA). The others change
# float32 results by rounding only, and each call of a rule costs a fixed Python overhead (an autograd Function
# under vmap: ~0.2-0.5 ms per call on the test machine's CPU, benchmarks/trial_rules.py), so in plain float32
# vmap's own batching runs them; in half or mixed precision their rules run.
ALWAYS = frozenset({"scaled_dot_product_attention"})
for _device in ("cpu", "cuda"):
    for _name in dir(F):
        if autocast_policy(_name, _device) is not None:
            RULES.setdefault(_name, None)

_lock = threading.Lock()
_depth = 0
_originals: dict[str, Callable[..., Any]] = {}
_wrappers: dict[tuple[str, int], Callable[..., Any]] = {}  # (name, id(original)) -> wrapper, built once


_HALF = (torch.float16, torch.bfloat16)


def reduced_precision(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a call computes in half precision: a float16/bfloat16 tensor argument, or autocast on its device.

    Example::

        >>> import torch
        >>> reduced_precision((torch.ones(2),), {}), reduced_precision((torch.ones(2, dtype=torch.bfloat16),), {})
        (False, True)
    """
    tensors = [value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)]
    return bool(tensors) and (
        any(t.dtype in _HALF for t in tensors) or torch.is_autocast_enabled(tensors[0].device.type)
    )


def wrap_with_rule(name: str, original: Callable[..., Any], rule: Rule | None) -> Callable[..., Any]:
    """``original``, run by ``rule`` (after autocast's cast policy) when an argument is mapped over by vmap.

    Example::

        >>> import torch
        >>> from torch.func import vmap
        >>> layer_norm = wrap_with_rule("layer_norm", F.layer_norm, RULES["layer_norm"])
        >>> x, weight = torch.randn(4, 3, dtype=torch.bfloat16), torch.randn(2, 3)  # mixed precision
        >>> out = vmap(lambda w: layer_norm(x, (3,), w))(weight)
        >>> out.dtype, torch.equal(out[1], F.layer_norm(x, (3,), weight[1]))
        (torch.bfloat16, True)
    """
    always = name in ALWAYS
    is_batched = torch._C._functorch.is_batchedtensor  # see batching.is_batched; here inline: every call pays it
    tensor_type = torch.Tensor

    @functools.wraps(original)
    def run_for_trials(*args: Any, **kwargs: Any) -> Any:
        # one pass over the arguments (this runs for every call of the function while a fused step runs)
        tensors = [value for value in args if isinstance(value, tensor_type)]
        if kwargs:
            tensors += [value for value in kwargs.values() if isinstance(value, tensor_type)]
        if tensors and has_torch_function(tensors):
            # a TorchFunctionMode (the first-batch argument check's recorder) or a tensor subclass is handed the
            # original, as the unfused call hands it; the recorder runs the rule through standing_in()
            return original(*args, **kwargs)
        # torch.compile traces an autograd Function's forward, not its vmap rule: compiled, vmap batches alone
        if not any(is_batched(t) for t in tensors) or torch.compiler.is_compiling():
            return original(*args, **kwargs)
        autocast = torch.is_autocast_enabled(tensors[0].device.type)
        if autocast:
            args, kwargs = cast_for_autocast(name, args, kwargs)
        if rule is None or not (always or autocast or any(t.dtype in _HALF for t in tensors)):
            return original(*args, **kwargs)
        return rule(original, args, kwargs)

    run_for_trials.__lightning_hydro_original__ = original  # type: ignore[attr-defined]
    return run_for_trials


_RULE_CODE = wrap_with_rule("linear", F.linear, None).__code__  # every wrapper runs this one code object


def is_rule_frame(code: Any) -> bool:
    """Whether a frame's code is a trial rule's wrapper (a recorder of the user's torch calls looks past it)."""
    return code is _RULE_CODE


def standing_in(function: Callable[..., Any]) -> Callable[..., Any]:
    """The wrapper installed in place of ``function`` while the rules are in, else ``function`` itself.

    A ``TorchFunctionMode`` is handed the original function (the wrapper calls it when a mode is active, so that
    the mode records what the unfused call records); a mode that runs the call runs this instead, which applies
    the rule, since the mode is switched off while it handles the call.
    """
    for name, original in _originals.items():
        if original is function:
            return getattr(F, name)
    return function


def _install(names: Iterable[str]) -> None:
    """Put the wrapper of each name into torch.nn.functional (built once per original function)."""
    for name in names:
        if name in _originals:
            continue
        original = getattr(F, name)
        _originals[name] = original
        wrapper = _wrappers.get((name, id(original)))
        if wrapper is None or wrapper.__lightning_hydro_original__ is not original:  # type: ignore[attr-defined]
            wrapper = _wrappers[(name, id(original))] = wrap_with_rule(name, original, RULES[name])
        setattr(F, name, wrapper)


@contextmanager
def trial_functional(*, reduced_precision: bool = True) -> Iterator[None]:
    """Install the trial rules in ``torch.nn.functional`` for the duration (re-entrant, thread-safe).

    Args:
        reduced_precision: whether the step may compute in half or mixed precision (autocast on, or half
            parameters): then every rule is installed; otherwise only those needed in float32 (:data:`ALWAYS`),
            so that a float32 step pays nothing for the others.

    Example::

        >>> original = F.layer_norm
        >>> with trial_functional():
        ...     F.layer_norm is original
        False
        >>> F.layer_norm is original
        True
    """
    global _depth
    with _lock:
        _install(RULES if reduced_precision else ALWAYS)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for name, original in _originals.items():
                    setattr(F, name, original)
                _originals.clear()
