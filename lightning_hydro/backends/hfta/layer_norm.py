"""Fused ``nn.LayerNorm`` with per-trial eps.

Each trial's slice is normalised over its last dims by ONE native ``layer_norm`` call on the
``[B, ...]`` tensor (the trial dim is never among the normalised dims), then scaled and shifted by the
stacked ``[B, *normalized_shape]`` weight and bias in one ``addcmul``. A shared input is normalised
once and broadcast against the per-trial affine. Trials whose eps differ use ``var_mean`` + ``rsqrt``.
Under mixed precision (a half-precision input, float32 parameters) the normalisation and the affine step
run in float32 and round once to the input's dtype, as the unfused kernel does; autocast's policy for
``layer_norm`` (float32 on CUDA) is applied first, as for the unfused module.
"""

from __future__ import annotations

from collections.abc import Sequence

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
from lightning_hydro.backends.trial_ops.autocast_policy import cast_for_autocast

_HALF = (torch.float16, torch.bfloat16)


def normalise_last_dims(
    samples: Tensor, shape: Sequence[int], weight: Tensor | None, bias: Tensor | None, eps: float
) -> Tensor:
    """Layer norm of ``[B or 1, ..., *shape]`` with per-trial ``[B, *shape]`` weight and bias.

    A half-precision input with float32 parameters (mixed precision) is computed as the unfused kernel computes
    it, in float32, and rounded once to the input's dtype: the forward pass then equals the unfused one. With
    every tensor in one dtype, the kernel normalises and the affine step follows in that dtype, as the fused
    ``LayerNorm`` operator does (measured in half precision: its gradients track the unfused kernel's closer
    than a float32 computation, whose backward rounds less often than the kernel's; docs/fused.md).
    """
    affine_shape = (-1, *([1] * (samples.dim() - 1 - len(shape))), *shape)
    dtypes = {t.dtype for t in (weight, bias) if t is not None}
    compute = torch.float32 if samples.dtype in _HALF and dtypes == {torch.float32} else samples.dtype
    out = F.layer_norm(samples.to(compute), tuple(shape), None, None, eps)
    if weight is not None and bias is not None:
        out = torch.addcmul(bias.to(compute).reshape(affine_shape), out, weight.to(compute).reshape(affine_shape))
    elif weight is not None:
        out = out * weight.to(compute).reshape(affine_shape)
    elif bias is not None:
        out = out + bias.to(compute).reshape(affine_shape)
    return out.to(samples.dtype)


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
        # autocast's policy for layer_norm (float32 on CUDA) decides the dtype, as for the unfused module
        (samples, weight, bias), _ = cast_for_autocast("layer_norm", (samples, weight, bias), {})
        scale = None if weight is None else trials_first(weight, weight_dim, trials)
        shift = None if bias is None else trials_first(bias, bias_dim, trials)
        out = normalise_last_dims(samples, normalized_shape, scale, shift, eps.first)
        return (out.squeeze(0), None) if out.shape[0] != trials else (out, 0)
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
