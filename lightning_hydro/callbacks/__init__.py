"""Lightning callbacks that stop trials early: successive halving, ASHA, Hyperband and a deadline (HyperSched).

On a :class:`~lightning_hydro.FusedLightningModule` they stop losing trials through its slot API (the group
really shrinks) and can refill freed slots; on an ordinary LightningModule (one trial per process) they share
rung records with the other processes through a SQLite file or a database server. The rules themselves live in
:mod:`lightning_hydro.schedulers`.
"""

from lightning_hydro.callbacks.asha import ASHA
from lightning_hydro.callbacks.deadline import Deadline
from lightning_hydro.callbacks.halving_callback import DEFAULT_STORE_FILE, HalvingCallback, TimeAttr
from lightning_hydro.callbacks.hyperband import Hyperband
from lightning_hydro.callbacks.refill_source import RefillSource, RefillSpec
from lightning_hydro.callbacks.successive_halving import SuccessiveHalving
from lightning_hydro.callbacks.trial_outcome import OutcomeStatus, TrialOutcome, format_summary

__all__ = [
    "ASHA",
    "DEFAULT_STORE_FILE",
    "Deadline",
    "HalvingCallback",
    "Hyperband",
    "OutcomeStatus",
    "RefillSource",
    "RefillSpec",
    "SuccessiveHalving",
    "TimeAttr",
    "TrialOutcome",
    "format_summary",
]
