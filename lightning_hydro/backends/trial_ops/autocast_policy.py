"""Autocast's cast policy, applied to a ``torch.nn.functional`` call before vmap decomposes it.

Under ``torch.func.vmap`` an op reaches torch's autocast only after vmap's batching rule has rewritten it into
other ops (autocast's dispatch key sits below vmap's). Where autocast's policy is registered on the op that vmap
rewrote, the pieces run at other precisions than the unfused op would: on CPU a ``conv2d`` becomes a
``convolution`` that autocast leaves in float32, a ``cross_entropy`` loses its float32 policy and runs in
bfloat16, a ``linear`` with per-trial bias adds that bias in float32. The trial rules therefore cast the
arguments of these functions as autocast would cast them for the unfused call, before vmap sees them.

The tables list, per device type, the ops of torch's autocast lists (``aten/src/ATen/autocast_mode.cpp`` and
``autocast_mode.h``) that ``torch.nn.functional`` exposes as one function; the others (``matmul``, ``softmax``,
pointwise ops) keep their policy under vmap, since vmap calls the same op on the stacked tensors.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

__all__ = ["Policy", "autocast_policy", "cast_for_autocast"]

Policy = Literal["lower_precision", "float32"]

_LOWER_PRECISION = frozenset(
    {
        "linear",
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "prelu",
        "scaled_dot_product_attention",
    }
)
_FLOAT32_LOSSES = frozenset(
    {
        "nll_loss",
        "mse_loss",
        "l1_loss",
        "smooth_l1_loss",
        "huber_loss",
        "kl_div",
        "binary_cross_entropy_with_logits",
        "poisson_nll_loss",
        "cosine_embedding_loss",
        "hinge_embedding_loss",
        "margin_ranking_loss",
        "soft_margin_loss",
        "triplet_margin_loss",
        "multi_margin_loss",
        "multilabel_margin_loss",
    }
)
_FLOAT32: dict[str, frozenset[str]] = {
    # CPU: the losses (cross_entropy_loss itself is listed) and binary_cross_entropy; not the norms
    "cpu": _FLOAT32_LOSSES | {"cross_entropy", "binary_cross_entropy"},
    # CUDA: the norms and the losses; cross_entropy is not listed (its log_softmax and nll_loss are, and vmap
    # calls those), binary_cross_entropy is refused by autocast itself
    "cuda": _FLOAT32_LOSSES | {"layer_norm", "group_norm", "cosine_similarity"},
}


def autocast_policy(name: str, device_type: str) -> Policy | None:
    """The policy autocast applies to ``torch.nn.functional.<name>`` on ``device_type``, if any.

    Example::

        >>> autocast_policy("conv2d", "cpu"), autocast_policy("layer_norm", "cuda"), autocast_policy("relu", "cpu")
        ('lower_precision', 'float32', None)
    """
    if name in _LOWER_PRECISION:
        return "lower_precision"
    if name in _FLOAT32.get(device_type, frozenset()):
        return "float32"
    return None


def _device_type(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor):
            return value.device.type
    return None


def _eligible(value: Any, device_type: str) -> bool:
    # what autocast casts: floating tensors other than float64 on the autocast device
    return (
        isinstance(value, Tensor)
        and value.is_floating_point()
        and value.dtype is not torch.float64
        and value.device.type == device_type
    )


def cast_for_autocast(
    name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of ``torch.nn.functional.<name>`` cast as autocast casts them, if autocast is on.

    Unchanged when autocast is off for the arguments' device or has no policy for ``name`` there.

    Example::

        >>> x = torch.ones(2, 3)
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):
        ...     (cast, _), _ = cast_for_autocast("linear", (x, x), {})
        >>> cast.dtype, cast_for_autocast("linear", (x, x), {})[0][0].dtype
        (torch.bfloat16, torch.float32)
    """
    device_type = _device_type(args, kwargs)
    if device_type is None or not torch.is_autocast_enabled(device_type):
        return args, kwargs
    policy = autocast_policy(name, device_type)
    if policy is None:
        return args, kwargs
    dtype = torch.get_autocast_dtype(device_type) if policy == "lower_precision" else torch.float32

    def cast(value: Any) -> Any:
        return value.to(dtype) if _eligible(value, device_type) and value.dtype is not dtype else value

    return tuple(cast(arg) for arg in args), {key: cast(value) for key, value in kwargs.items()}
