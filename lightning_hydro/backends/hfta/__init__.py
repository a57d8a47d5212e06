"""hfta backend: B trials' modules converted into fused operators (HFTA-style horizontal fusion).

Entry points: :func:`convert_to_fused` (and :func:`plan_conversion` to inspect without converting),
:func:`select_trials` when trials are removed. The operators themselves live one per module.
"""

from lightning_hydro.backends.hfta.activations import FusedLeakyReLU, FusedPReLU
from lightning_hydro.backends.hfta.attention import FusedMultiheadAttention
from lightning_hydro.backends.hfta.batch_norm import FusedBatchNorm1d, FusedBatchNorm2d, FusedBatchNorm3d
from lightning_hydro.backends.hfta.conv_transpose import (
    FusedConvTranspose1d,
    FusedConvTranspose2d,
    FusedConvTranspose3d,
)
from lightning_hydro.backends.hfta.conversion import (
    ConversionPlan,
    ModuleDecision,
    convert_to_fused,
    plan_conversion,
    select_trials,
)
from lightning_hydro.backends.hfta.convolution import FusedConv1d, FusedConv2d, FusedConv3d
from lightning_hydro.backends.hfta.dropout import FusedDropout, FusedDropout1d, FusedDropout2d, FusedDropout3d
from lightning_hydro.backends.hfta.embedding import FusedEmbedding
from lightning_hydro.backends.hfta.errors import ConversionError, FusedCallError
from lightning_hydro.backends.hfta.fused_module import FusedModule, TrialAnchor, TrialFunction
from lightning_hydro.backends.hfta.group_norm import FusedGroupNorm
from lightning_hydro.backends.hfta.layer_norm import FusedLayerNorm
from lightning_hydro.backends.hfta.linear import FusedLinear
from lightning_hydro.backends.hfta.per_trial import PerTrial
from lightning_hydro.backends.hfta.registry import FUSED_OPERATORS
from lightning_hydro.backends.hfta.trial_groups import TrialGroupedModule

__all__ = [
    "FUSED_OPERATORS",
    "ConversionError",
    "ConversionPlan",
    "FusedBatchNorm1d",
    "FusedBatchNorm2d",
    "FusedBatchNorm3d",
    "FusedCallError",
    "FusedConv1d",
    "FusedConv2d",
    "FusedConv3d",
    "FusedConvTranspose1d",
    "FusedConvTranspose2d",
    "FusedConvTranspose3d",
    "FusedDropout",
    "FusedDropout1d",
    "FusedDropout2d",
    "FusedDropout3d",
    "FusedEmbedding",
    "FusedGroupNorm",
    "FusedLayerNorm",
    "FusedLeakyReLU",
    "FusedLinear",
    "FusedModule",
    "FusedMultiheadAttention",
    "FusedPReLU",
    "ModuleDecision",
    "PerTrial",
    "TrialAnchor",
    "TrialFunction",
    "TrialGroupedModule",
    "convert_to_fused",
    "plan_conversion",
    "select_trials",
]
