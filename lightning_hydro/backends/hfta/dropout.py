"""Fused dropout with a per-trial drop probability ``p`` and independent masks.

Used only when trials differ in ``p``: with one ``p`` for all trials, torch's own vmap rule for dropout
(independent masks under ``randomness="different"``) is already what a fused operator would do, and
the module is left as it is. The fused rule draws ``[B, ...]`` uniforms once, keeps an element of trial
``b`` when its draw is below ``1 - p[b]``, and scales kept elements by ``1 / (1 - p[b])``; the feature
variants (``Dropout1d/2d/3d``) draw one value per (sample, channel) and broadcast it over positions.
"""

from __future__ import annotations

from torch import Tensor, nn

from lightning_hydro.backends.hfta.fused_operator import (
    FusedModule,
    InDims,
    TrialFunction,
    VmapInfo,
    drop_per_trial,
    trials_first_or_shared,
)


def fused_dropout(
    info: VmapInfo, in_dims: InDims, x: Tensor, anchor: Tensor | None, module: FusedModule, mask_dims: int
) -> tuple[Tensor, int]:
    """The fused rule of the dropout family; returns (output ``[B, ...]``, its trial dim 0).

    The first ``mask_dims`` per-trial dims get their own draws, the rest share them (``-1``: every
    element gets its own).
    """
    module.check_trial_count(info.batch_size)
    trials = info.batch_size
    samples = trials_first_or_shared(x, in_dims[0])  # [B or 1, ...]
    logical_shape = samples.shape[1:]
    if mask_dims < 0:
        mask_shape = (trials, *logical_shape)
    else:
        mask_shape = (trials, *logical_shape[:mask_dims], *([1] * (len(logical_shape) - mask_dims)))
    keep_probability = 1.0 - module.setting("p").column(samples, len(mask_shape))
    return drop_per_trial(samples, keep_probability, mask_shape, info.randomness, like=samples), 0


class FusedDropoutFunction(TrialFunction):
    """Autograd Function whose vmap rule is :func:`fused_dropout`."""

    vmap = staticmethod(fused_dropout)


class _FusedDropout(FusedModule):
    per_trial_attributes = ("p",)

    def mask_dims(self, input: Tensor) -> int:
        """How many leading dims of ``input`` get their own draws (``-1``: all of them)."""
        return -1

    def forward(self, input: Tensor) -> Tensor:
        """Same contract as the torch dropout module's forward, per trial and with that trial's ``p``."""
        if not self.training:
            return input
        return FusedDropoutFunction.apply(input, self.anchor(), self, self.mask_dims(input))


class FusedDropout(_FusedDropout, nn.Dropout):
    """``nn.Dropout`` for B trials that differ in ``p``; masks are independent per trial.

    Example::

        >>> import torch
        >>> from torch.func import functional_call, vmap
        >>> trials = [nn.Dropout(p) for p in (0.0, 1.0)]
        >>> fused = FusedDropout.fuse(nn.Dropout(), trials, path="drop")
        >>> x = torch.ones(3)
        >>> vmap(lambda t: functional_call(fused, {}, (x + t,)), randomness="different")(torch.zeros(2))
        tensor([[1., 1., 1.],
                [0., 0., 0.]])
    """

    fused_from = nn.Dropout


class _FusedFeatureDropout(_FusedDropout):
    spatial_dims = 2

    def mask_dims(self, input: Tensor) -> int:
        """Draws per (sample, channel), or per channel for an input without its sample dim."""
        if self.spatial_dims == 2:  # torch's Dropout2d reads a 3D input as [N, C, L], not [C, H, W]
            return 2
        return 1 if input.dim() == self.spatial_dims + 1 else 2


class FusedDropout1d(_FusedFeatureDropout, nn.Dropout1d):
    """``nn.Dropout1d`` (whole channels) for B trials that differ in ``p``.

    Example::

        >>> trials = [nn.Dropout1d(p) for p in (0.1, 0.3)]
        >>> FusedDropout1d.fuse(nn.Dropout1d(), trials).setting("p").values
        (0.1, 0.3)
    """

    fused_from = nn.Dropout1d
    spatial_dims = 1


class FusedDropout2d(_FusedFeatureDropout, nn.Dropout2d):
    """``nn.Dropout2d`` (whole channels) for B trials that differ in ``p``.

    A 3D input is treated as ``[N, C, L]``, as torch's ``Dropout2d`` does today.

    Example::

        >>> trials = [nn.Dropout2d(p) for p in (0.1, 0.3)]
        >>> FusedDropout2d.fuse(nn.Dropout2d(), trials).num_trials
        2
    """

    fused_from = nn.Dropout2d
    spatial_dims = 2


class FusedDropout3d(_FusedFeatureDropout, nn.Dropout3d):
    """``nn.Dropout3d`` (whole channels) for B trials that differ in ``p``.

    Example::

        >>> trials = [nn.Dropout3d(p) for p in (0.1, 0.3)]
        >>> FusedDropout3d.fuse(nn.Dropout3d(), trials).num_trials
        2
    """

    fused_from = nn.Dropout3d
    spatial_dims = 3
