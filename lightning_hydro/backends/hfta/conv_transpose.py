"""Fused ``nn.ConvTranspose1d`` / ``2d`` / ``3d``: one grouped transposed convolution over all trials.

Same layout as :mod:`~lightning_hydro.backends.hfta.convolution`: input ``[N, B*C, *spatial]`` with
``groups = B * groups``, output ``[N, B, O, *spatial]`` (trial dim 1, a view). A shared input is
expanded to all trials first (a copy of the input only; it is usually a small noise tensor).
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from lightning_hydro.backends.hfta.convolution import fold_trials, unfold_trials
from lightning_hydro.backends.hfta.fused_operator import (
    FusedModule,
    InDims,
    TrialFunction,
    VmapInfo,
    trials_first,
)

_TRANSPOSED_CONVOLUTIONS: dict[int, Callable[..., Tensor]] = {
    1: F.conv_transpose1d,
    2: F.conv_transpose2d,
    3: F.conv_transpose3d,
}


def fused_conv_transpose(
    info: VmapInfo,
    in_dims: InDims,
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    module: FusedModule,
    output_padding: list[int],
) -> tuple[Tensor, int]:
    """The fused rule of ConvTranspose1d/2d/3d; returns (output, its trial dim)."""
    module.check_trial_count(info.batch_size)
    trials = info.batch_size
    x_dim, weight_dim, bias_dim = in_dims[:3]
    spatial_dims = len(module.kernel_size)  # type: ignore[arg-type]
    groups: int = module.groups  # type: ignore[assignment]
    weight = trials_first(weight, weight_dim, trials)  # [B, C, O/groups, *kernel]
    all_weights = weight.reshape(-1, *weight.shape[2:])
    out_channels = weight.shape[2] * groups
    all_biases = None if bias is None else trials_first(bias, bias_dim, trials).reshape(-1)
    per_trial = trials_first(x, x_dim, trials)
    unbatched_sample = per_trial.dim() - 1 == spatial_dims + 1
    samples = fold_trials(per_trial, unbatched_sample)
    out = _TRANSPOSED_CONVOLUTIONS[spatial_dims](
        samples,
        all_weights,
        all_biases,
        module.stride,
        module.padding,
        output_padding,
        trials * groups,
        module.dilation,
    )
    return unfold_trials(out, trials, out_channels, unbatched_sample)


class FusedConvTransposeFunction(TrialFunction):
    """Autograd Function whose vmap rule is :func:`fused_conv_transpose`."""

    vmap = staticmethod(fused_conv_transpose)


class _FusedConvTranspose(FusedModule):
    def forward(self, input: Tensor, output_size: list[int] | None = None) -> Tensor:
        """Same contract as the torch transposed convolution's forward, per trial."""
        spatial_dims = len(self.kernel_size)  # type: ignore[arg-type]
        output_padding = self._output_padding(  # type: ignore[operator]
            input, output_size, self.stride, self.padding, self.kernel_size, spatial_dims, self.dilation
        )
        return FusedConvTransposeFunction.apply(input, self.weight, self.bias, self, output_padding)


class FusedConvTranspose1d(_FusedConvTranspose, nn.ConvTranspose1d):
    """``nn.ConvTranspose1d`` for B trials at once.

    Example::

        >>> trials = [nn.ConvTranspose1d(3, 2, 3, stride=2) for _ in range(2)]
        >>> FusedConvTranspose1d.fuse(nn.ConvTranspose1d(3, 2, 3, stride=2), trials).num_trials
        2
    """

    fused_from = nn.ConvTranspose1d


class FusedConvTranspose2d(_FusedConvTranspose, nn.ConvTranspose2d):
    """``nn.ConvTranspose2d`` for B trials at once, as one grouped transposed convolution.

    Example::

        >>> from torch.func import functional_call, stack_module_state, vmap
        >>> import torch
        >>> trials = [nn.ConvTranspose2d(3, 2, 3, stride=2) for _ in range(2)]
        >>> fused = FusedConvTranspose2d.fuse(nn.ConvTranspose2d(3, 2, 3, stride=2), trials, path="up")
        >>> params, _ = stack_module_state(trials)
        >>> x = torch.randn(4, 3, 5, 5)
        >>> out = vmap(lambda p: functional_call(fused, p, (x,)))(params)
        >>> out.shape, torch.allclose(out[0], trials[0](x), atol=1e-6)
        (torch.Size([2, 4, 2, 11, 11]), True)
    """

    fused_from = nn.ConvTranspose2d


class FusedConvTranspose3d(_FusedConvTranspose, nn.ConvTranspose3d):
    """``nn.ConvTranspose3d`` for B trials at once.

    Example::

        >>> trials = [nn.ConvTranspose3d(2, 2, 2) for _ in range(3)]
        >>> FusedConvTranspose3d.fuse(nn.ConvTranspose3d(2, 2, 2), trials).num_trials
        3
    """

    fused_from = nn.ConvTranspose3d
