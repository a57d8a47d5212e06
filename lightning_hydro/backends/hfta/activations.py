"""Fused activations: ``LeakyReLU`` with a per-trial slope, ``PReLU`` with per-trial learnable slopes.

Activations without per-trial settings (ReLU, GELU, SiLU, Tanh, Sigmoid, ... and LeakyReLU/ELU with one
setting for all trials) are left to torch's vmap rules, which already apply the op once to the whole
``[B, ...]`` tensor in whatever layout it comes. Other activations whose trials differ in a Python
setting (ELU ``alpha``, GELU ``approximate``, ...) are handled by
:class:`~lightning_hydro.backends.hfta.trial_grouped_module.TrialGroupedModule`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_hydro.backends.hfta.fused_operator import (
    FusedModule,
    InDims,
    TrialFunction,
    VmapInfo,
    trials_first,
    trials_first_or_shared,
)


def fused_leaky_relu(
    info: VmapInfo, in_dims: InDims, x: Tensor, anchor: Tensor | None, module: FusedModule
) -> tuple[Tensor, int]:
    """The fused rule of LeakyReLU: ``x if x > 0 else slope[b] * x``; returns (output ``[B, ...]``, 0)."""
    module.check_trial_count(info.batch_size)
    samples = trials_first_or_shared(x, in_dims[0])
    slopes = module.setting("negative_slope").column(samples, samples.dim())
    return torch.where(samples > 0, samples, samples * slopes), 0


def fused_prelu(info: VmapInfo, in_dims: InDims, x: Tensor, weight: Tensor, module: FusedModule) -> tuple[Tensor, int]:
    """The fused rule of PReLU, stacked slopes ``[B, num_parameters]``; returns (output ``[B, ...]``, 0)."""
    module.check_trial_count(info.batch_size)
    trials = info.batch_size
    samples = trials_first_or_shared(x, in_dims[0])
    slopes = trials_first(weight, in_dims[1], trials)
    logical_dims = samples.dim() - 1
    shape = [trials] + [1] * logical_dims
    parameters = slopes.shape[1]
    if parameters > 1:  # one slope per channel, dim 1 of the input; inputs under 2D have one channel
        channels = samples.shape[2] if logical_dims >= 2 else 1
        if channels != parameters:
            raise RuntimeError(
                f"{module.describe()}: Mismatch of parameter numbers and input channel size. Found parameter "
                f"numbers = {parameters} and channel size = {channels}."
            )
        shape[2] = parameters
    return torch.where(samples > 0, samples, samples * slopes.reshape(shape)), 0


class FusedLeakyReLUFunction(TrialFunction):
    """Autograd Function whose vmap rule is :func:`fused_leaky_relu`."""

    vmap = staticmethod(fused_leaky_relu)


class FusedPReLUFunction(TrialFunction):
    """Autograd Function whose vmap rule is :func:`fused_prelu`."""

    vmap = staticmethod(fused_prelu)


class FusedLeakyReLU(FusedModule, nn.LeakyReLU):
    """``nn.LeakyReLU`` for B trials that differ in ``negative_slope``.

    Example::

        >>> from torch.func import functional_call, vmap
        >>> fused = FusedLeakyReLU.fuse(nn.LeakyReLU(), [nn.LeakyReLU(s) for s in (0.1, 0.5)])
        >>> x = -torch.ones(2, 3)  # one input per trial
        >>> vmap(lambda t: functional_call(fused, {}, (t,)))(x)
        tensor([[-0.1000, -0.1000, -0.1000],
                [-0.5000, -0.5000, -0.5000]])
    """

    fused_from = nn.LeakyReLU
    per_trial_attributes = ("negative_slope",)

    def forward(self, input: Tensor) -> Tensor:
        """Same contract as ``nn.LeakyReLU.forward``, with each trial's own slope."""
        return FusedLeakyReLUFunction.apply(input, self.anchor(), self)


class FusedPReLU(FusedModule, nn.PReLU):
    """``nn.PReLU`` for B trials, each with its own learnable slopes (rows of the stacked ``weight``).

    Example::

        >>> from torch.func import functional_call, stack_module_state, vmap
        >>> trials = [nn.PReLU(3, init=a) for a in (0.1, 0.2)]
        >>> fused = FusedPReLU.fuse(nn.PReLU(3), trials, path="act")
        >>> params, _ = stack_module_state(trials)
        >>> x = -torch.ones(4, 3, 5)
        >>> out = vmap(lambda p: functional_call(fused, p, (x,)))(params)
        >>> out[:, 0, :, 0]
        tensor([[-0.1000, -0.1000, -0.1000],
                [-0.2000, -0.2000, -0.2000]], grad_fn=<SelectBackward0>)
    """

    fused_from = nn.PReLU
    construction_only_attributes = ("init",)

    def forward(self, input: Tensor) -> Tensor:
        """Same contract as ``nn.PReLU.forward``, with each trial's own slopes."""
        return FusedPReLUFunction.apply(input, self.weight, self)
