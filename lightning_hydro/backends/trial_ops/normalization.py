"""Batch, group and layer normalisation for every trial at once, at the dtypes of the unfused call.

vmap's own batching of these ops splits them: it normalises with the kernel and applies each trial's weight
and bias afterwards, and (batch norm) hands the kernel running statistics without the weight. Under mixed
precision the unfused kernel takes a bfloat16 input with float32 weight and statistics and returns bfloat16;
split, the affine step promotes to float32, and batch norm's kernel refuses the float32 statistics next to a
bfloat16 input (``Expected running_mean to have type BFloat16 but got Float`` on CUDA, ``expected scalar type
BFloat16 but found Float`` on CPU). The rules here keep one kernel call with every argument the unfused call
passes:

- batch norm and group norm fold the trials into the channels, ``[N, B * C, *]``, with the stacked weight,
  bias and running statistics flattened to ``[B * C]`` (group norm with ``B * groups`` groups: a trial's
  groups are consecutive channels). The kernel updates the running statistics in place, in the stacked rows.
- layer norm normalises over the last dims, which never include the trial dim; a per-trial weight cannot be
  handed to the kernel, so the kernel normalises and the rule applies the weight and bias. Under mixed
  precision it does so in float32 and rounds once to the input's dtype, as the kernel does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_hydro.backends.hfta.layer_norm import normalise_last_dims
from lightning_hydro.backends.trial_ops.batching import (
    VmapOnlyFunction,
    is_batched,
    trials_first,
    trials_first_or_shared,
    trials_next_to_batch,
)

__all__ = ["batch_norm_rule", "group_norm_rule", "layer_norm_rule"]

_BATCH_NORM = F.batch_norm
_GROUP_NORM = F.group_norm
_HALF = (torch.float16, torch.bfloat16)


def _unfused_dtypes_agree(input: Tensor, parameters: Sequence[Tensor | None]) -> bool:
    """Whether the unfused kernel accepts these dtypes: all equal, or a half input with float32 parameters."""
    dtypes = {p.dtype for p in parameters if p is not None}
    return not dtypes or dtypes == {input.dtype} or (input.dtype in _HALF and dtypes == {torch.float32})


def _per_channel(tensor: Tensor | None, in_dim: int | None, trials: int) -> Tensor | None:
    return None if tensor is None else trials_first(tensor, in_dim, trials).reshape(-1)


def fold_batch_norm(
    info: Any,
    in_dims: tuple[int | None, ...],
    input: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None,
    bias: Tensor | None,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple[Tensor, int]:
    """The vmap rule of batch norm: trials folded into channels; returns (output, its trial dim 1)."""
    trials = info.batch_size
    samples = trials_next_to_batch(input, in_dims[0], trials)  # [N, B, C, *]
    flat = samples.reshape(samples.shape[0], -1, *samples.shape[3:])
    statistics = [
        None if rows is None else trials_first(rows, dim, trials)
        for rows, dim in zip((running_mean, running_var), in_dims[1:3])
    ]
    flat_statistics = [None if s is None else s.reshape(-1) for s in statistics]
    out = _BATCH_NORM(
        flat,
        flat_statistics[0],
        flat_statistics[1],
        _per_channel(weight, in_dims[3], trials),
        _per_channel(bias, in_dims[4], trials),
        training,
        momentum,
        eps,
    )
    if training:
        with torch.no_grad():  # a running statistic that reshape had to copy: its update goes back to its rows
            for rows, flat_rows in zip(statistics, flat_statistics):
                if rows is not None and flat_rows is not None and flat_rows.data_ptr() != rows.data_ptr():
                    rows.copy_(flat_rows.view(rows.shape))
    return out.view(samples.shape), 1


class FoldedBatchNorm(VmapOnlyFunction):
    """Batch norm whose vmap rule is :func:`fold_batch_norm`."""

    vmap = staticmethod(fold_batch_norm)


def _batch_norm_signature(
    input: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> tuple[Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor | None, bool, float, float]:
    return input, running_mean, running_var, weight, bias, training, momentum, eps


def batch_norm_rule(original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``batch_norm(*args, **kwargs)`` for all trials in one kernel call, or ``original`` where it cannot fold.

    Running statistics shared by all trials cannot be updated per trial (training) and are left to vmap's own
    batching, which refuses them; so are dtypes the unfused kernel refuses.
    """
    input, running_mean, running_var, weight, bias, training, momentum, eps = _batch_norm_signature(*args, **kwargs)
    shared_statistics = any(s is not None and not is_batched(s) for s in (running_mean, running_var))
    if (
        input.dim() < 2
        or (training and shared_statistics)
        or not _unfused_dtypes_agree(input, (running_mean, running_var, weight, bias))
    ):
        return original(*args, **kwargs)
    return FoldedBatchNorm.apply(input, running_mean, running_var, weight, bias, training, momentum, eps)


def fold_group_norm(
    info: Any,
    in_dims: tuple[int | None, ...],
    input: Tensor,
    num_groups: int,
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
) -> tuple[Tensor, int]:
    """The vmap rule of group norm: trials folded into channels and groups; returns (output, trial dim 1)."""
    trials = info.batch_size
    samples = trials_next_to_batch(input, in_dims[0], trials)  # [N, B, C, *]
    flat = samples.reshape(samples.shape[0], -1, *samples.shape[3:])
    out = _GROUP_NORM(
        flat, trials * num_groups, _per_channel(weight, in_dims[2], trials), _per_channel(bias, in_dims[3], trials), eps
    )
    return out.view(samples.shape), 1


class FoldedGroupNorm(VmapOnlyFunction):
    """Group norm whose vmap rule is :func:`fold_group_norm`."""

    vmap = staticmethod(fold_group_norm)


def _group_norm_signature(
    input: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
) -> tuple[Tensor, int, Tensor | None, Tensor | None, float]:
    return input, num_groups, weight, bias, eps


def group_norm_rule(original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``group_norm(*args, **kwargs)`` for all trials in one kernel call (``original`` for what it refuses)."""
    input, num_groups, weight, bias, eps = _group_norm_signature(*args, **kwargs)
    if input.dim() < 2 or input.shape[1] % num_groups or not _unfused_dtypes_agree(input, (weight, bias)):
        return original(*args, **kwargs)  # the unfused call's own error
    return FoldedGroupNorm.apply(input, num_groups, weight, bias, eps)


def fold_layer_norm(
    info: Any,
    in_dims: tuple[int | None, ...],
    input: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None,
    bias: Tensor | None,
    eps: float,
) -> tuple[Tensor, int | None]:
    """The vmap rule of layer norm; returns (output, its trial dim: 0, or None when every trial shares it)."""
    trials = info.batch_size
    samples = trials_first_or_shared(input, in_dims[0])  # [B or 1, ...]
    affine = [None if t is None else trials_first(t, d, trials) for t, d in zip((weight, bias), in_dims[2:4])]
    out = normalise_last_dims(samples, normalized_shape, affine[0], affine[1], eps)
    if out.shape[0] != trials:
        return out.squeeze(0), None  # a shared input without affine parameters: one result serves every trial
    return out, 0


class FoldedLayerNorm(VmapOnlyFunction):
    """Layer norm whose vmap rule is :func:`fold_layer_norm`."""

    vmap = staticmethod(fold_layer_norm)


def _layer_norm_signature(
    input: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> tuple[Tensor, Sequence[int], Tensor | None, Tensor | None, float]:
    return input, normalized_shape, weight, bias, eps


def layer_norm_rule(original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``layer_norm(*args, **kwargs)`` for all trials at the unfused kernel's dtypes (``original`` otherwise)."""
    input, normalized_shape, weight, bias, eps = _layer_norm_signature(*args, **kwargs)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    fits = input.dim() >= len(shape) and tuple(input.shape[input.dim() - len(shape) :]) == shape
    if not fits or not _unfused_dtypes_agree(input, (weight, bias)):
        return original(*args, **kwargs)  # the unfused call's own error
    return FoldedLayerNorm.apply(input, shape, weight, bias, eps)
