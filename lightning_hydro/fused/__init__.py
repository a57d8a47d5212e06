"""Fused trials: the FusedLightningModule, per-trial logging and results (stacked state: lightning_hydro.stacking)."""

from lightning_hydro.fused.module import FusedLightningModule
from lightning_hydro.fused.verify.fusion import FusionMismatchError
from lightning_hydro.schedulers.trial_record import TrialRecord, TrialStatus, format_results_table
from lightning_hydro.stacking import ArchitectureMismatchError, StackedState

__all__ = [
    "ArchitectureMismatchError",
    "FusedLightningModule",
    "FusionMismatchError",
    "StackedState",
    "TrialRecord",
    "TrialStatus",
    "format_results_table",
]
