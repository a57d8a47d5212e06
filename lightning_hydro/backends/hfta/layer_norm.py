"""Fused ``nn.LayerNorm`` with per-trial eps.

Each trial's slice is normalised over its last dims by ONE native ``layer_norm`` call on the
``[B, ...]`` tensor (the trial dim is never among the normalised dims), then scaled and shifted by the
stacked ``[B, *normalized_shape]`` weight and bias in one ``addcmul``. A shared input is normalised
once and broadcast against the per-trial affine. Trials whose eps differ use ``var_mean`` + ``rsqrt``.
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
    trials_first,
    trials_first_or_shared,
)


def fused_layer_norm(
    info: VmapInfo,
    in_dims: InDims,
    x: Tensor,
    weight: Tensor | None,
    bias: Tensor | None,
    anchor: Tensor | None,
    module: FusedModule,
) -> tuple[Tensor, int | None]:
    """The fused rule of LayerNorm; returns (output, its trial dim or None when shared by all trials)."""
    module.check_trial_count(info.batch_size)
    trials = info.batch_size
    x_dim, weight_dim, bias_dim = in_dims[:3]
    normalized_shape: tuple[int, ...] = module.normalized_shape  # type: ignore[assignment]
    samples = trials_first_or_shared(x, x_dim)  # [B or 1, ...]
    eps = module.setting("eps")
    if eps.is_uniform:
        out = F.layer_norm(samples, normalized_shape, None, None, eps.first)
    else:
        dims = tuple(range(samples.dim() - len(normalized_shape), samples.dim()))
        variance, mean = torch.var_mean(samples, dim=dims, correction=0, keepdim=True)
        out = (samples - mean) * torch.rsqrt(variance + eps.column(samples, samples.dim()))
    affine_shape = (trials, *([1] * (samples.dim() - 1 - len(normalized_shape))), *normalized_shape)
    if weight is not None and bias is not None:
        scale = trials_first(weight, weight_dim, trials).reshape(affine_shape)
        shift = trials_first(bias, bias_dim, trials).reshape(affine_shape)
        out = torch.addcmul(shift, out, scale)
    elif weight is not None:
        out = out * trials_first(weight, weight_dim, trials).reshape(affine_shape)
    elif bias is not None:
        out = out + trials_first(bias, bias_dim, trials).reshape(affine_shape)
    if out.shape[0] != trials:  # shared input, no affine, one eps: one result serves every trial
        return out.squeeze(0), None
    return out, 0


class FusedLayerNormFunction(TrialFunction):
    """Autograd Function whose vmap rule is :func:`fused_layer_norm`."""

    vmap = staticmethod(fused_layer_norm)


class FusedLayerNorm(FusedModule, nn.LayerNorm):
    """``nn.LayerNorm`` for B trials at once, each with its own eps and affine parameters.

    Example::

        >>> from torch.func import functional_call, stack_module_state, vmap
        >>> trials = [nn.LayerNorm(4, eps=e) for e in (1e-5, 1e-2)]
        >>> fused = FusedLayerNorm.fuse(nn.LayerNorm(4), trials, path="norm")
        >>> params, _ = stack_module_state(trials)
        >>> x = torch.randn(3, 4)
        >>> out = vmap(lambda p: functional_call(fused, p, (x,)))(params)
        >>> torch.allclose(out[1], trials[1](x), atol=1e-6)
        True
    """

    fused_from = nn.LayerNorm
    per_trial_attributes = ("eps",)

    def forward(self, input: Tensor) -> Tensor:
        """Same contract as ``nn.LayerNorm.forward``, per trial."""
        return FusedLayerNormFunction.apply(input, self.weight, self.bias, self.anchor(), self)
