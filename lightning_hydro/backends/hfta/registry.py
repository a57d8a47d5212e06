"""Which torch module becomes which fused operator, and which modules are best left to vmap."""

from __future__ import annotations

from torch import nn

from lightning_hydro.backends.hfta.activations import FusedLeakyReLU, FusedPReLU
from lightning_hydro.backends.hfta.attention import FusedMultiheadAttention
from lightning_hydro.backends.hfta.batch_norm import FusedBatchNorm1d, FusedBatchNorm2d, FusedBatchNorm3d
from lightning_hydro.backends.hfta.conv_transpose import (
    FusedConvTranspose1d,
    FusedConvTranspose2d,
    FusedConvTranspose3d,
)
from lightning_hydro.backends.hfta.convolution import FusedConv1d, FusedConv2d, FusedConv3d
from lightning_hydro.backends.hfta.dropout import FusedDropout, FusedDropout1d, FusedDropout2d, FusedDropout3d
from lightning_hydro.backends.hfta.embedding import FusedEmbedding
from lightning_hydro.backends.hfta.fused_operator import FusedModule
from lightning_hydro.backends.hfta.group_norm import FusedGroupNorm
from lightning_hydro.backends.hfta.layer_norm import FusedLayerNorm
from lightning_hydro.backends.hfta.linear import FusedLinear
from lightning_hydro.backends.hfta.pooling import (
    FusedAdaptiveAvgPool1d,
    FusedAdaptiveAvgPool2d,
    FusedAdaptiveAvgPool3d,
    FusedAdaptiveMaxPool1d,
    FusedAdaptiveMaxPool2d,
    FusedAdaptiveMaxPool3d,
    FusedAvgPool1d,
    FusedAvgPool2d,
    FusedAvgPool3d,
    FusedMaxPool1d,
    FusedMaxPool2d,
    FusedMaxPool3d,
)
from lightning_hydro.backends.hfta.transformer import FusedTransformerEncoder, FusedTransformerEncoderLayer

FUSED_OPERATORS: dict[type[nn.Module], type[FusedModule]] = {
    fused.fused_from: fused
    for fused in (
        FusedLinear,
        FusedConv1d,
        FusedConv2d,
        FusedConv3d,
        FusedConvTranspose1d,
        FusedConvTranspose2d,
        FusedConvTranspose3d,
        FusedBatchNorm1d,
        FusedBatchNorm2d,
        FusedBatchNorm3d,
        FusedLayerNorm,
        FusedGroupNorm,
        FusedEmbedding,
        FusedMultiheadAttention,
        FusedPReLU,
        FusedLeakyReLU,
        FusedDropout,
        FusedDropout1d,
        FusedDropout2d,
        FusedDropout3d,
        FusedMaxPool1d,
        FusedMaxPool2d,
        FusedMaxPool3d,
        FusedAvgPool1d,
        FusedAvgPool2d,
        FusedAvgPool3d,
        FusedAdaptiveAvgPool1d,
        FusedAdaptiveAvgPool2d,
        FusedAdaptiveAvgPool3d,
        FusedAdaptiveMaxPool1d,
        FusedAdaptiveMaxPool2d,
        FusedAdaptiveMaxPool3d,
    )
}
"""Exact torch module type -> its fused operator (subclasses may override forward, so they are not fused)."""

FUSED_CONTAINERS: dict[type[nn.Module], type[FusedModule]] = {
    fused.fused_from: fused for fused in (FusedTransformerEncoder, FusedTransformerEncoderLayer)
}
"""Modules with children that are swapped too (their children are converted one by one as usual)."""

ONLY_WHEN_TRIALS_DIFFER: frozenset[type[nn.Module]] = frozenset(
    {nn.LeakyReLU, nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d}
)
"""Fused only when trials differ in a setting: otherwise torch's elementwise vmap rule is already optimal."""

GROUPABLE_MODULE_FILES: frozenset[str] = frozenset(
    f"torch.nn.modules.{name}"
    for name in ("activation", "dropout", "pooling", "flatten", "padding", "pixelshuffle", "upsampling")
)
"""Torch files whose parameter-free modules map one tensor to one tensor and may run grouped by setting."""


def has_tensors(module: nn.Module) -> bool:
    """Whether the module (or a submodule) holds any parameter or buffer."""
    return any(True for _ in module.parameters()) or any(True for _ in module.buffers())


def is_groupable(module: nn.Module) -> bool:
    """Whether ``module`` is a parameter-free torch module that can run grouped by trial settings.

    Example::

        >>> is_groupable(nn.ELU()), is_groupable(nn.PReLU()), is_groupable(nn.Linear(1, 1))
        (True, False, False)
    """
    stateless = not has_tensors(module)
    return (
        stateless
        and type(module).__module__ in GROUPABLE_MODULE_FILES
        and not isinstance(module, nn.MultiheadAttention)
    )
