"""Fused ``nn.GroupNorm`` with per-trial eps.

Layout: trials become channels, ``[N, B*C, *spatial]``, and ONE native ``group_norm`` call with
``B * num_groups`` groups normalises every trial's groups (a trial's groups are consecutive channels)
and applies the stacked affine parameters, flattened to ``[B*C]``. The output is returned as
``[N, B, C, *spatial]`` (trial dim 1, a view). Trials whose eps differ use ``var_mean`` + ``rsqrt``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_hydro.backends.hfta.fused_operator import (
    FusedModule,
    InDims,
    TrialFunction,
    VmapInfo,
    channel_affine,
    trials_at,
    trials_first,
)


def fused_group_norm(
    info: VmapInfo,
    in_dims: InDims,
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    anchor: Tensor | None,
    module: FusedModule,
) -> tuple[Tensor, int]:
    """The fused rule of GroupNorm; returns (output, its trial dim)."""
    module.check_trial_count(info.batch_size)
    trials = info.batch_size
    x_dim, weight_dim, bias_dim = in_dims[:3]
    num_groups: int = module.num_groups  # type: ignore[assignment]
    samples = trials_at(x, x_dim, 1, trials)  # [N, B, C, *spatial]
    batch, channels = samples.shape[0], samples.shape[2]
    eps = module.setting("eps")
    if eps.is_uniform:
        flat_weight = None if weight is None else trials_first(weight, weight_dim, trials).reshape(-1)
        flat_bias = None if bias is None else trials_first(bias, bias_dim, trials).reshape(-1)
        flat = samples.reshape(batch, trials * channels, *samples.shape[3:])
        out = F.group_norm(flat, trials * num_groups, flat_weight, flat_bias, eps.first)
        return out.view(samples.shape), 1
    grouped = samples.reshape(batch, trials, num_groups, -1)
    variance, mean = torch.var_mean(grouped, dim=-1, correction=0, keepdim=True)
    per_trial_eps = eps.column(samples, 3).unsqueeze(0)  # [1, B, 1, 1]
    out = ((grouped - mean) * torch.rsqrt(variance + per_trial_eps)).view(samples.shape)
    return channel_affine(out, weight, bias, weight_dim, bias_dim, trials), 1


class FusedGroupNormFunction(TrialFunction):
    """Autograd Function whose vmap rule is :func:`fused_group_norm`."""

    vmap = staticmethod(fused_group_norm)


class FusedGroupNorm(FusedModule, nn.GroupNorm):
    """``nn.GroupNorm`` for B trials at once, each with its own eps and affine parameters.

    Example::

        >>> from torch.func import functional_call, stack_module_state, vmap
        >>> trials = [nn.GroupNorm(2, 4) for _ in range(3)]
        >>> fused = FusedGroupNorm.fuse(nn.GroupNorm(2, 4), trials, path="norm")
        >>> params, _ = stack_module_state(trials)
        >>> x = torch.randn(5, 4, 6)
        >>> out = vmap(lambda p: functional_call(fused, p, (x,)))(params)
        >>> torch.allclose(out[2], trials[2](x), atol=1e-6)
        True
    """

    fused_from = nn.GroupNorm
    per_trial_attributes = ("eps",)

    def forward(self, input: Tensor) -> Tensor:
        """Same contract as ``nn.GroupNorm.forward``, per trial."""
        return FusedGroupNormFunction.apply(input, self.weight, self.bias, self.anchor(), self)
