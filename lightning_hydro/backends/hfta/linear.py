"""Fused ``nn.Linear``: one matmul over all trials.

Layouts: a shared input ``[*, I]`` meets all B weights in ONE ``addmm`` against ``[I, B*O]`` and comes
out as ``[*, B, O]`` (trial dim -2, no copy); a per-trial input is moved to ``[B, M, I]`` and multiplied
by ``baddbmm`` with the ``[B, I, O]`` weights.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_hydro.backends.hfta.fused_operator import (
    FusedModule,
    InDims,
    TrialFunction,
    VmapInfo,
    logical_shape,
    trials_first,
)


def linear_shared(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``x`` ``[*, I]`` shared by all trials times ``weight`` ``[B, O, I]`` (+ ``bias`` ``[B, O]``): ``[*, B, O]``.

    One ``addmm`` against all trials' weights side by side.
    """
    trials, out_features, in_features = weight.shape
    rows = x.reshape(-1, in_features)
    all_weights = weight.reshape(trials * out_features, in_features).t()
    out = rows @ all_weights if bias is None else torch.addmm(bias.reshape(-1), rows, all_weights)
    return out.view(*x.shape[:-1], trials, out_features)


def linear_per_trial(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """Each trial's own input ``x`` ``[B, *, I]`` times its ``weight`` ``[B, O, I]`` (+ ``bias``): ``[B, *, O]``."""
    trials, out_features, in_features = weight.shape
    rows = x.reshape(trials, -1, in_features)
    if bias is None:
        out = torch.bmm(rows, weight.transpose(1, 2))
    else:
        out = torch.baddbmm(bias.unsqueeze(1), rows, weight.transpose(1, 2))
    return out.view(*x.shape[:-1], out_features)


def fused_linear(
    info: VmapInfo, in_dims: InDims, x: Tensor, weight: Tensor, bias: Tensor | None, module: FusedModule
) -> tuple[Tensor, int]:
    """The fused rule: ``x @ weight[b].T + bias[b]`` for each trial ``b``; returns (output, its trial dim)."""
    module.check_trial_count(info.batch_size)
    trials = info.batch_size
    x_dim, weight_dim, bias_dim = in_dims[:3]
    weight = trials_first(weight, weight_dim, trials)
    in_features = weight.shape[2]
    if logical_shape(x, x_dim)[-1] != in_features:
        raise RuntimeError(
            f"{module.describe()}: per-trial input has shape {tuple(logical_shape(x, x_dim))}, expected "
            f"in_features={in_features} in its last dim"
        )
    stacked_bias = None if bias is None else trials_first(bias, bias_dim, trials)
    if x_dim is None:
        return linear_shared(x, weight, stacked_bias), x.dim() - 1
    return linear_per_trial(x.movedim(x_dim, 0), weight, stacked_bias), 0


class FusedLinearFunction(TrialFunction):
    """Autograd Function whose vmap rule is :func:`fused_linear`."""

    vmap = staticmethod(fused_linear)


class FusedLinear(FusedModule, nn.Linear):
    """``nn.Linear`` for B trials at once (stacked ``weight`` ``[B, O, I]``, ``bias`` ``[B, O]``).

    Example::

        >>> from torch.func import functional_call, stack_module_state, vmap
        >>> trials = [nn.Linear(4, 3) for _ in range(2)]
        >>> fused = FusedLinear.fuse(nn.Linear(4, 3), trials, path="fc")
        >>> params, buffers = stack_module_state(trials)
        >>> x = torch.randn(5, 4)
        >>> out = vmap(lambda p: functional_call(fused, p, (x,)))(params)
        >>> torch.allclose(out[1], trials[1](x), atol=1e-6)
        True
    """

    fused_from = nn.Linear

    def forward(self, input: Tensor) -> Tensor:
        """Same contract as ``nn.Linear.forward``, per trial."""
        return FusedLinearFunction.apply(input, self.weight, self.bias, self)
