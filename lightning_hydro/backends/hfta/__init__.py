"""hfta backend: B trials' modules converted into fused operators (HFTA-style horizontal fusion).

Entry points: :func:`convert_to_fused` (and :func:`plan_conversion` to inspect without converting),
:func:`select_trials` when trials are removed. The operators themselves (``FusedLinear``, ``FusedConv2d``,
...) live one per module, importable from there (e.g. ``lightning_hydro.backends.hfta.linear.FusedLinear``);
:data:`FUSED_OPERATORS` maps each torch module class to its operator.
"""

from lightning_hydro.backends.hfta.conversion import (
    ConversionPlan,
    ModuleDecision,
    convert_to_fused,
    plan_conversion,
    select_trials,
)
from lightning_hydro.backends.hfta.errors import ConversionError, FusedCallError
from lightning_hydro.backends.hfta.registry import FUSED_OPERATORS

__all__ = [
    "FUSED_OPERATORS",
    "ConversionError",
    "ConversionPlan",
    "FusedCallError",
    "ModuleDecision",
    "convert_to_fused",
    "plan_conversion",
    "select_trials",
]
