"""Fused ``nn.BatchNorm1d`` / ``2d`` / ``3d`` with per-trial momentum, eps and running statistics.

Layout: trials become channels, ``[N, B*C, *spatial]``, normalised by ONE native ``batch_norm`` call
and returned as ``[N, B, C, *spatial]`` (trial dim 1, a view). Batch statistics come out of that same
call (momentum 1 into scratch buffers), and each trial's running statistics, which are rows of the
stacked buffers, are then updated in place with that trial's own momentum (``None``: cumulative
average over its own ``num_batches_tracked``). Trials whose eps differ are normalised by a composite
of ``var_mean`` and ``rsqrt`` instead.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_hydro.backends.hfta.errors import FusedCallError
from lightning_hydro.backends.hfta.fused_operator import (
    FusedModule,
    InDims,
    TrialFunction,
    VmapInfo,
    channel_affine,
    trials_at,
    trials_first,
)
from lightning_hydro.backends.hfta.per_trial import PerTrial


def _momentum_factors(module: FusedModule, num_batches_tracked: Tensor | None, like: Tensor) -> Tensor:
    """Each trial's running-average factor, ``[B, 1]``: its momentum, or 1 / its batch count if None."""
    momenta = module.setting("momentum").values
    factors = torch.tensor([0.0 if m is None else m for m in momenta], dtype=torch.float64, device=like.device)
    if any(m is None for m in momenta):
        if num_batches_tracked is None:
            raise FusedCallError(f"{module.describe()} has momentum=None but no num_batches_tracked buffer")
        cumulative = torch.tensor([m is None for m in momenta], device=like.device)
        factors = torch.where(cumulative, 1.0 / num_batches_tracked.to(torch.float64), factors)
    return factors.to(like.dtype).view(-1, 1)


def _eps_column(eps: PerTrial[float], samples: Tensor) -> Tensor:
    """Per-trial eps shaped ``[1, B, 1, ...]`` to broadcast against ``[N, B, C, *spatial]``."""
    return eps.column(samples, samples.dim() - 1).unsqueeze(0)


def _composite_batch_norm(
    samples: Tensor, mean: Tensor | None, variance: Tensor | None, eps: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Normalises ``[N, B, C, *]`` with per-trial eps ``[1, B, 1, ...]``.

    Returns:
        The normalised tensor, the mean used and the biased variance used.
    """
    reduce_dims = (0, *range(3, samples.dim()))
    if mean is None or variance is None:
        variance, mean = torch.var_mean(samples, dim=reduce_dims, correction=0, keepdim=True)
    else:
        shape = (1, *mean.shape, *([1] * (samples.dim() - 3)))
        mean, variance = mean.reshape(shape), variance.reshape(shape)
    return (samples - mean) * torch.rsqrt(variance + eps), mean, variance


def fused_batch_norm(
    info: VmapInfo,
    in_dims: InDims,
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    num_batches_tracked: Tensor | None,
    anchor: Tensor | None,
    module: FusedModule,
    use_batch_stats: bool,
    update_running_stats: bool,
) -> tuple[Tensor, int]:
    """The fused rule of BatchNorm1d/2d/3d; returns (output, its trial dim)."""
    module.check_trial_count(info.batch_size)
    trials = info.batch_size
    x_dim, weight_dim, bias_dim, mean_dim, var_dim = in_dims[:5]
    samples = trials_at(x, x_dim, 1, trials)  # [N, B, C, *spatial]
    batch, channels, spatial = samples.shape[0], samples.shape[2], samples.shape[3:]
    flat = samples.reshape(batch, trials * channels, *spatial)
    flat_weight = None if weight is None else trials_first(weight, weight_dim, trials).reshape(-1)
    flat_bias = None if bias is None else trials_first(bias, bias_dim, trials).reshape(-1)
    stats_mean = None if running_mean is None else trials_first(running_mean, mean_dim, trials)
    stats_var = None if running_var is None else trials_first(running_var, var_dim, trials)
    if update_running_stats and (mean_dim is None or var_dim is None):
        raise FusedCallError(
            f"{module.describe()} must update per-trial running statistics, but they are not batched over "
            "trials; pass the stacked buffers (in_dims=0) to vmap together with the stacked parameters"
        )
    eps = module.setting("eps")
    if use_batch_stats:
        count = batch * math.prod(spatial)
        if count <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {x.shape}")
        if eps.is_uniform:
            # scratch statistics in the running statistics' dtype (else the weight's): under mixed precision the
            # kernel takes a half-precision input with float32 parameters and statistics, as the unfused call
            reference = next((t for t in (stats_mean, flat_weight) if t is not None), x)
            batch_mean = torch.zeros(trials * channels, dtype=reference.dtype, device=x.device)
            batch_var = torch.ones(trials * channels, dtype=reference.dtype, device=x.device)
            out = F.batch_norm(flat, batch_mean, batch_var, flat_weight, flat_bias, True, 1.0, eps.first)
            out = out.view(samples.shape)
        else:
            out, mean, biased_var = _composite_batch_norm(samples, None, None, _eps_column(eps, samples))
            out = channel_affine(out, weight, bias, weight_dim, bias_dim, trials)
            batch_mean, batch_var = mean.detach(), biased_var.detach() * (count / (count - 1))
        if update_running_stats and stats_mean is not None and stats_var is not None:
            factors = _momentum_factors(module, num_batches_tracked, stats_mean)
            with torch.no_grad():
                stats_mean.mul_(1 - factors).add_(factors * batch_mean.view(trials, channels))
                stats_var.mul_(1 - factors).add_(factors * batch_var.view(trials, channels))
        return out, 1
    if stats_mean is None or stats_var is None:
        raise FusedCallError(f"{module.describe()} has no running statistics to normalise with in eval mode")
    if eps.is_uniform:
        out = F.batch_norm(
            flat, stats_mean.reshape(-1), stats_var.reshape(-1), flat_weight, flat_bias, False, 0.0, eps.first
        )
        return out.view(samples.shape), 1
    out, _, _ = _composite_batch_norm(samples, stats_mean, stats_var, _eps_column(eps, samples))
    return channel_affine(out, weight, bias, weight_dim, bias_dim, trials), 1


class FusedBatchNormFunction(TrialFunction):
    """Autograd Function whose vmap rule is :func:`fused_batch_norm`."""

    vmap = staticmethod(fused_batch_norm)


class _FusedBatchNorm(FusedModule):
    per_trial_attributes = ("momentum", "eps")

    def forward(self, input: Tensor) -> Tensor:
        """Same contract as ``nn.BatchNorm*d.forward``, per trial (running statistics included)."""
        self._check_input_dim(input)  # type: ignore[operator]
        tracks: bool = self.track_running_stats  # type: ignore[assignment]
        batch_count: Tensor | None = self.num_batches_tracked  # type: ignore[assignment]
        if self.training and tracks and batch_count is not None:
            batch_count.add_(1)
        running_mean = self.running_mean if not self.training or tracks else None
        running_var = self.running_var if not self.training or tracks else None
        use_batch_stats = self.training or (running_mean is None and running_var is None)
        return FusedBatchNormFunction.apply(
            input,
            self.weight,
            self.bias,
            running_mean,
            running_var,
            self.num_batches_tracked,
            self.anchor(),
            self,
            use_batch_stats,
            self.training and running_mean is not None,
        )


class FusedBatchNorm1d(_FusedBatchNorm, nn.BatchNorm1d):
    """``nn.BatchNorm1d`` for B trials at once, each with its own momentum, eps and running stats.

    Example::

        >>> from torch.func import functional_call, stack_module_state, vmap
        >>> trials = [nn.BatchNorm1d(3, momentum=m) for m in (0.1, 0.5)]
        >>> fused = FusedBatchNorm1d.fuse(nn.BatchNorm1d(3), trials, path="bn")
        >>> params, buffers = stack_module_state(trials)
        >>> x = torch.randn(8, 3) + 1.0
        >>> _ = vmap(lambda p, b: functional_call(fused, (p, b), (x,)), in_dims=(0, 0))(params, buffers)
        >>> _ = [trial(x) for trial in trials]
        >>> torch.allclose(buffers["running_mean"], torch.stack([t.running_mean for t in trials]))
        True
    """

    fused_from = nn.BatchNorm1d


class FusedBatchNorm2d(_FusedBatchNorm, nn.BatchNorm2d):
    """``nn.BatchNorm2d`` for B trials at once, each with its own momentum, eps and running stats.

    Example::

        >>> trials = [nn.BatchNorm2d(3, eps=e) for e in (1e-5, 1e-3)]
        >>> FusedBatchNorm2d.fuse(nn.BatchNorm2d(3), trials).setting("eps").values
        (1e-05, 0.001)
    """

    fused_from = nn.BatchNorm2d


class FusedBatchNorm3d(_FusedBatchNorm, nn.BatchNorm3d):
    """``nn.BatchNorm3d`` for B trials at once, each with its own momentum, eps and running stats.

    Example::

        >>> trials = [nn.BatchNorm3d(2, momentum=None) for _ in range(2)]
        >>> FusedBatchNorm3d.fuse(nn.BatchNorm3d(2), trials).setting("momentum").values
        (None, None)
    """

    fused_from = nn.BatchNorm3d
