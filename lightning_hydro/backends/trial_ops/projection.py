"""``linear`` and ``conv1d/2d/3d`` with per-trial weights as ONE kernel call, the bias added inside it.

vmap's own batching of these ops adds a per-trial bias in a second op. In float32 that is a rounding apart
from the unfused call; in half precision it rounds the product once more than the unfused kernel does (the
matmul's float32 accumulator meets the bias before the one rounding), a difference that training amplifies.
The rules here use the fused-operator library's layouts: a shared input meets all B weights in one ``addmm``
(one convolution with ``B * O`` output channels), a per-trial input is multiplied by ``baddbmm`` (one grouped
convolution with the trials as channel groups); the bias is an argument of that one call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.nn.functional as F
from torch import Tensor

from lightning_hydro.backends.hfta.convolution import fold_trials, unfold_trials
from lightning_hydro.backends.hfta.linear import linear_per_trial, linear_shared
from lightning_hydro.backends.trial_ops.batching import VmapOnlyFunction, is_batched, trials_first

__all__ = ["convolution_rule", "linear_rule"]

_CONVOLUTIONS: dict[int, Callable[..., Tensor]] = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def fold_linear(
    info: Any, in_dims: tuple[int | None, ...], input: Tensor, weight: Tensor, bias: Tensor | None
) -> tuple[Tensor, int]:
    """The vmap rule of ``linear`` with per-trial weights; returns (output, its trial dim)."""
    trials = info.batch_size
    weights = trials_first(weight, in_dims[1], trials)
    biases = None if bias is None else trials_first(bias, in_dims[2], trials)
    if in_dims[0] is None:
        return linear_shared(input, weights, biases), input.dim() - 1
    return linear_per_trial(input.movedim(in_dims[0], 0), weights, biases), 0


class FoldedLinear(VmapOnlyFunction):
    """``linear`` whose vmap rule is :func:`fold_linear`."""

    vmap = staticmethod(fold_linear)


def _linear_signature(
    input: Tensor, weight: Tensor, bias: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor | None]:
    return input, weight, bias


def linear_rule(original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``linear(*args, **kwargs)``: one matmul for all trials' weights (``original`` for a shared weight)."""
    input, weight, bias = _linear_signature(*args, **kwargs)
    dtypes = {t.dtype for t in (input, weight, bias) if t is not None}
    if not is_batched(weight) or weight.dim() != 2 or input.dim() < 1 or len(dtypes) != 1:
        return original(*args, **kwargs)  # vmap's own batching calls linear itself, or the unfused error
    return FoldedLinear.apply(input, weight, bias)


def fold_convolution(
    info: Any,
    in_dims: tuple[int | None, ...],
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: Any,
    padding: Any,
    dilation: Any,
    groups: int,
) -> tuple[Tensor, int]:
    """The vmap rule of ``conv1d/2d/3d`` with per-trial weights; returns (output, its trial dim)."""
    trials = info.batch_size
    weights = trials_first(weight, in_dims[1], trials)
    out_channels, spatial_dims = weights.shape[1], weights.dim() - 3
    all_weights = weights.reshape(trials * out_channels, *weights.shape[2:])
    all_biases = None if bias is None else trials_first(bias, in_dims[2], trials).reshape(-1)
    convolve = _CONVOLUTIONS[spatial_dims]
    unbatched_sample = input.dim() - (in_dims[0] is not None) == spatial_dims + 1  # no N dim
    if in_dims[0] is None and groups == 1:  # a shared input meets all trials' kernels in one convolution
        samples = input.unsqueeze(0) if unbatched_sample else input
        out = convolve(samples, all_weights, all_biases, stride, padding, dilation, 1)
    else:
        samples = fold_trials(trials_first(input, in_dims[0], trials), unbatched_sample)
        out = convolve(samples, all_weights, all_biases, stride, padding, dilation, trials * groups)
    return unfold_trials(out, trials, out_channels, unbatched_sample)


class FoldedConvolution(VmapOnlyFunction):
    """``conv1d/2d/3d`` whose vmap rule is :func:`fold_convolution`."""

    vmap = staticmethod(fold_convolution)


def _convolution_signature(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> tuple[Tensor, Tensor, Tensor | None, Any, Any, Any, int]:
    return input, weight, bias, stride, padding, dilation, groups


def convolution_rule(original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``conv{1,2,3}d(*args, **kwargs)``: one grouped convolution for all trials' kernels (or ``original``)."""
    input, weight, bias, stride, padding, dilation, groups = _convolution_signature(*args, **kwargs)
    spatial_dims = weight.dim() - 2
    dtypes = {t.dtype for t in (input, weight, bias) if t is not None}
    fits = spatial_dims in _CONVOLUTIONS and input.dim() in (spatial_dims + 1, spatial_dims + 2)
    if not is_batched(weight) or not fits or len(dtypes) != 1 or original is not _CONVOLUTIONS.get(spatial_dims):
        return original(*args, **kwargs)  # a shared kernel: vmap calls the convolution itself
    return FoldedConvolution.apply(input, weight, bias, stride, padding, dilation, groups)
