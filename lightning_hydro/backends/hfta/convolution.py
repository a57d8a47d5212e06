"""Fused ``nn.Conv1d`` / ``nn.Conv2d`` / ``nn.Conv3d``: one grouped convolution over all trials.

Layout: trials become channel groups, ``[N, B*C, *spatial]`` with ``groups = B * groups``, and the
output ``[N, B*O, *spatial]`` is returned as ``[N, B, O, *spatial]`` with trial dim 1: a view, so the
next fused convolution, normalisation or pooling reads it without a copy, and each trial's slice keeps
the row-major layout that user code such as ``x.view(x.size(0), -1)`` relies on. A shared input (the
data batch) meets all B weights in one ordinary convolution with ``B*O`` output channels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from lightning_hydro.backends.hfta.fused_operator import (
    FusedModule,
    InDims,
    TrialFunction,
    VmapInfo,
    logical_shape,
    trials_first,
)

_CONVOLUTIONS: dict[int, Callable[..., Tensor]] = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def convolve(module: nn.Module, x: Tensor, weight: Tensor, bias: Tensor | None, groups: int) -> Tensor:
    """``module``'s convolution (stride, padding, padding mode, dilation) with given weights and groups."""
    spatial_dims = len(module.kernel_size)  # type: ignore[arg-type]
    padding: Any = module.padding
    if module.padding_mode != "zeros":
        # Non-zero padding modes pad each channel alone, so padding the B*C channels at once is exact.
        x = F.pad(x, module._reversed_padding_repeated_twice, mode=module.padding_mode)  # type: ignore[arg-type]
        padding = 0
    return _CONVOLUTIONS[spatial_dims](x, weight, bias, module.stride, padding, module.dilation, groups)


def fold_trials(per_trial: Tensor, unbatched_sample: bool) -> Tensor:
    """``[B, N, C, *S]`` (``[B, C, *S]`` for an unbatched sample) as ``[N, B*C, *S]``: trials become channel groups."""
    if unbatched_sample:
        per_trial = per_trial.unsqueeze(1)
    samples = per_trial.transpose(0, 1)
    return samples.reshape(samples.shape[0], -1, *samples.shape[3:])


def unfold_trials(out: Tensor, trials: int, out_channels: int, unbatched_sample: bool) -> tuple[Tensor, int]:
    """``[N, B*O, *S]`` as ``[N, B, O, *S]`` (trial dim 1), or ``[B, O, *S]`` (dim 0) for an unbatched sample."""
    out = out.view(out.shape[0], trials, out_channels, *out.shape[2:])
    if unbatched_sample:
        return out.squeeze(0), 0
    return out, 1


def fused_convolution(
    info: VmapInfo, in_dims: InDims, x: Tensor, weight: Tensor, bias: Tensor | None, module: FusedModule
) -> tuple[Tensor, int]:
    """The fused rule of Conv1d/2d/3d; returns (output, its trial dim)."""
    module.check_trial_count(info.batch_size)
    trials = info.batch_size
    x_dim, weight_dim, bias_dim = in_dims[:3]
    groups: int = module.groups  # type: ignore[assignment]
    spatial_dims = len(module.kernel_size)  # type: ignore[arg-type]
    weight = trials_first(weight, weight_dim, trials)
    out_channels = weight.shape[1]
    all_weights = weight.reshape(trials * out_channels, *weight.shape[2:])
    all_biases = None if bias is None else trials_first(bias, bias_dim, trials).reshape(-1)
    shape = logical_shape(x, x_dim)
    unbatched_sample = len(shape) == spatial_dims + 1  # conv input without its N dim
    if len(shape) not in (spatial_dims + 1, spatial_dims + 2) or shape[-spatial_dims - 1] != module.in_channels:
        raise RuntimeError(
            f"{module.describe()}: per-trial input has shape {tuple(shape)}, expected [N, "
            f"{module.in_channels}, +{spatial_dims} spatial dims] or [{module.in_channels}, +spatial dims]"
        )
    if x_dim is None and groups == 1:
        samples = x.unsqueeze(0) if unbatched_sample else x
        out = convolve(module, samples, all_weights, all_biases, 1)
    else:
        samples = fold_trials(trials_first(x, x_dim, trials), unbatched_sample)
        out = convolve(module, samples, all_weights, all_biases, trials * groups)
    return unfold_trials(out, trials, out_channels, unbatched_sample)


class FusedConvolutionFunction(TrialFunction):
    """Autograd Function whose vmap rule is :func:`fused_convolution`."""

    vmap = staticmethod(fused_convolution)


class _FusedConvolution(FusedModule):
    def forward(self, input: Tensor) -> Tensor:
        """Same contract as the torch convolution's forward, per trial."""
        return FusedConvolutionFunction.apply(input, self.weight, self.bias, self)


class FusedConv1d(_FusedConvolution, nn.Conv1d):
    """``nn.Conv1d`` for B trials at once, as one grouped convolution.

    Example::

        >>> from torch.func import functional_call, stack_module_state, vmap
        >>> import torch
        >>> trials = [nn.Conv1d(3, 4, 3) for _ in range(2)]
        >>> fused = FusedConv1d.fuse(nn.Conv1d(3, 4, 3), trials, path="conv")
        >>> params, _ = stack_module_state(trials)
        >>> x = torch.randn(5, 3, 10)
        >>> out = vmap(lambda p: functional_call(fused, p, (x,)))(params)
        >>> torch.allclose(out[1], trials[1](x), atol=1e-6)
        True
    """

    fused_from = nn.Conv1d


class FusedConv2d(_FusedConvolution, nn.Conv2d):
    """``nn.Conv2d`` for B trials at once, as one grouped convolution.

    Example::

        >>> from torch.func import functional_call, stack_module_state, vmap
        >>> import torch
        >>> trials = [nn.Conv2d(3, 4, 3, padding=1) for _ in range(2)]
        >>> fused = FusedConv2d.fuse(nn.Conv2d(3, 4, 3, padding=1), trials, path="conv")
        >>> params, _ = stack_module_state(trials)
        >>> x = torch.randn(5, 3, 8, 8)
        >>> out = vmap(lambda p: functional_call(fused, p, (x,)))(params)
        >>> out.shape, torch.allclose(out[1], trials[1](x), atol=1e-6)
        (torch.Size([2, 5, 4, 8, 8]), True)
    """

    fused_from = nn.Conv2d


class FusedConv3d(_FusedConvolution, nn.Conv3d):
    """``nn.Conv3d`` for B trials at once, as one grouped convolution.

    Example::

        >>> import torch
        >>> trials = [nn.Conv3d(2, 3, 2) for _ in range(2)]
        >>> FusedConv3d.fuse(nn.Conv3d(2, 3, 2), trials, path="conv").num_trials
        2
    """

    fused_from = nn.Conv3d
