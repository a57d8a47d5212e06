"""Fused trials: stacked state, the FusedLightningModule, per-trial logging and results."""

from lightning_hydro.fused.fused_module import FusedLightningModule
from lightning_hydro.fused.results import TrialRecord, TrialStatus, format_results_table
from lightning_hydro.fused.stacked_state import ArchitectureMismatchError, StackedState
from lightning_hydro.fused.verify import FusionMismatchError

__all__ = [
    "ArchitectureMismatchError",
    "FusedLightningModule",
    "FusionMismatchError",
    "StackedState",
    "TrialRecord",
    "TrialStatus",
    "format_results_table",
]
