"""Fused pooling: max, average and adaptive pooling in 1, 2 and 3 spatial dims.

Pooling has no parameters and works per channel, so the fused rule folds the trials into the channel
dim, ``[N, B*C, *spatial]`` (a view when the input comes from a fused convolution or normalisation),
runs the module's own torch forward once, and returns ``[N, B, C, *spatial]`` (trial dim 1). vmap's
own rule folds the trials into the sample dim instead, which costs a copy of such inputs. A shared
input is pooled once, for all trials.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from lightning_hydro.backends.hfta.fused_operator import FusedModule, InDims, TrialFunction, VmapInfo

Pooled = Tensor | tuple[Tensor, Tensor]


def fused_pooling(
    info: VmapInfo, in_dims: InDims, x: Tensor, anchor: Tensor | None, module: FusedModule
) -> tuple[Pooled, Any]:
    """The fused rule of every pooling module; returns (output(s), trial dim(s))."""
    module.check_trial_count(info.batch_size)
    pool = module.fused_from.forward
    x_dim = in_dims[0]
    if x_dim is None:
        out = pool(module, x)
        return out, (None, None) if isinstance(out, tuple) else None
    spatial_dims: int = module.spatial_dims  # type: ignore[assignment]
    per_trial = x.movedim(x_dim, 0)
    if per_trial.dim() - 1 == spatial_dims + 1:  # [B, C, *spatial]: the trials act as samples
        out = pool(module, per_trial)
        return out, (0, 0) if isinstance(out, tuple) else 0
    samples = per_trial.transpose(0, 1)  # [N, B, C, *spatial]
    folded = samples.reshape(samples.shape[0], -1, *samples.shape[3:])
    out = pool(module, folded)
    if isinstance(out, tuple):
        return tuple(o.view(samples.shape[:3] + o.shape[2:]) for o in out), (1, 1)
    return out.view(samples.shape[:3] + out.shape[2:]), 1


class FusedPoolingFunction(TrialFunction):
    """Autograd Function whose vmap rule is :func:`fused_pooling`."""

    vmap = staticmethod(fused_pooling)


class _FusedPooling(FusedModule):
    spatial_dims = 2

    def forward(self, input: Tensor) -> Any:
        """Same contract as the torch pooling module's forward (``return_indices`` included), per trial."""
        return FusedPoolingFunction.apply(input, self.anchor(), self)


class FusedMaxPool1d(_FusedPooling, nn.MaxPool1d):
    """``nn.MaxPool1d`` for B trials at once.

    Example::

        >>> FusedMaxPool1d.fuse(nn.MaxPool1d(2), [nn.MaxPool1d(2)] * 3).num_trials
        3
    """

    fused_from = nn.MaxPool1d
    spatial_dims = 1


class FusedMaxPool2d(_FusedPooling, nn.MaxPool2d):
    """``nn.MaxPool2d`` for B trials at once: one pooling call over ``[N, B*C, H, W]``.

    Example::

        >>> import torch
        >>> from torch.func import functional_call, vmap
        >>> fused = FusedMaxPool2d.fuse(nn.MaxPool2d(2), [nn.MaxPool2d(2)] * 2)
        >>> x = torch.randn(2, 4, 3, 6, 6)  # one input per trial
        >>> out = vmap(lambda t: functional_call(fused, {}, (t,)))(x)
        >>> torch.equal(out[1], nn.MaxPool2d(2)(x[1]))
        True
    """

    fused_from = nn.MaxPool2d
    spatial_dims = 2


class FusedMaxPool3d(_FusedPooling, nn.MaxPool3d):
    """``nn.MaxPool3d`` for B trials at once.

    Example::

        >>> FusedMaxPool3d.fuse(nn.MaxPool3d(2), [nn.MaxPool3d(2)] * 2).num_trials
        2
    """

    fused_from = nn.MaxPool3d
    spatial_dims = 3


class FusedAvgPool1d(_FusedPooling, nn.AvgPool1d):
    """``nn.AvgPool1d`` for B trials at once.

    Example::

        >>> FusedAvgPool1d.fuse(nn.AvgPool1d(2), [nn.AvgPool1d(2)] * 2).num_trials
        2
    """

    fused_from = nn.AvgPool1d
    spatial_dims = 1


class FusedAvgPool2d(_FusedPooling, nn.AvgPool2d):
    """``nn.AvgPool2d`` for B trials at once.

    Example::

        >>> FusedAvgPool2d.fuse(nn.AvgPool2d(2), [nn.AvgPool2d(2)] * 2).num_trials
        2
    """

    fused_from = nn.AvgPool2d
    spatial_dims = 2


class FusedAvgPool3d(_FusedPooling, nn.AvgPool3d):
    """``nn.AvgPool3d`` for B trials at once.

    Example::

        >>> FusedAvgPool3d.fuse(nn.AvgPool3d(2), [nn.AvgPool3d(2)] * 2).num_trials
        2
    """

    fused_from = nn.AvgPool3d
    spatial_dims = 3


class FusedAdaptiveAvgPool1d(_FusedPooling, nn.AdaptiveAvgPool1d):
    """``nn.AdaptiveAvgPool1d`` for B trials at once.

    Example::

        >>> FusedAdaptiveAvgPool1d.fuse(nn.AdaptiveAvgPool1d(1), [nn.AdaptiveAvgPool1d(1)] * 2).num_trials
        2
    """

    fused_from = nn.AdaptiveAvgPool1d
    spatial_dims = 1


class FusedAdaptiveAvgPool2d(_FusedPooling, nn.AdaptiveAvgPool2d):
    """``nn.AdaptiveAvgPool2d`` for B trials at once.

    Example::

        >>> FusedAdaptiveAvgPool2d.fuse(nn.AdaptiveAvgPool2d(1), [nn.AdaptiveAvgPool2d(1)] * 2).num_trials
        2
    """

    fused_from = nn.AdaptiveAvgPool2d
    spatial_dims = 2


class FusedAdaptiveAvgPool3d(_FusedPooling, nn.AdaptiveAvgPool3d):
    """``nn.AdaptiveAvgPool3d`` for B trials at once.

    Example::

        >>> FusedAdaptiveAvgPool3d.fuse(nn.AdaptiveAvgPool3d(1), [nn.AdaptiveAvgPool3d(1)] * 2).num_trials
        2
    """

    fused_from = nn.AdaptiveAvgPool3d
    spatial_dims = 3


class FusedAdaptiveMaxPool1d(_FusedPooling, nn.AdaptiveMaxPool1d):
    """``nn.AdaptiveMaxPool1d`` for B trials at once.

    Example::

        >>> FusedAdaptiveMaxPool1d.fuse(nn.AdaptiveMaxPool1d(1), [nn.AdaptiveMaxPool1d(1)] * 2).num_trials
        2
    """

    fused_from = nn.AdaptiveMaxPool1d
    spatial_dims = 1


class FusedAdaptiveMaxPool2d(_FusedPooling, nn.AdaptiveMaxPool2d):
    """``nn.AdaptiveMaxPool2d`` for B trials at once.

    Example::

        >>> FusedAdaptiveMaxPool2d.fuse(nn.AdaptiveMaxPool2d(1), [nn.AdaptiveMaxPool2d(1)] * 2).num_trials
        2
    """

    fused_from = nn.AdaptiveMaxPool2d
    spatial_dims = 2


class FusedAdaptiveMaxPool3d(_FusedPooling, nn.AdaptiveMaxPool3d):
    """``nn.AdaptiveMaxPool3d`` for B trials at once.

    Example::

        >>> FusedAdaptiveMaxPool3d.fuse(nn.AdaptiveMaxPool3d(1), [nn.AdaptiveMaxPool3d(1)] * 2).num_trials
        2
    """

    fused_from = nn.AdaptiveMaxPool3d
    spatial_dims = 3
