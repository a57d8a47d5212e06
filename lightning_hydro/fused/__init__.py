"""Fused trials: the FusedLightningModule, per-trial logging and results (stacked state: lightning_hydro.stacking)."""

from lightning_hydro._deprecation import Renamed, renamed_names
from lightning_hydro.fused.module import FusedLightningModule
from lightning_hydro.fused.verify.fusion import FusionMismatchError
from lightning_hydro.stopping.trial_record import format_results_table

__all__ = [
    "FusedLightningModule",
    "FusionMismatchError",
    "format_results_table",
]

# Names exported from their own package now (each public name has one home), kept here for one release.
__getattr__ = renamed_names(
    __name__,
    {
        name: Renamed(
            f"{home}:{name}",
            f"is exported from {home} (each public name from one package); import {home}.{name} instead",
        )
        for name, home in {
            "ArchitectureMismatchError": "lightning_hydro.stacking",
            "StackedState": "lightning_hydro.stacking",
            "TrialRecord": "lightning_hydro.stopping",
            "TrialStatus": "lightning_hydro.stopping",
        }.items()
    },
)
