"""Lightning callbacks that stop trials early: successive halving, ASHA, Hyperband and a deadline (HyperSched).

On a :class:`~lightning_hydro.FusedLightningModule` they stop losing trials through its slot API (the group
really shrinks) and can refill freed slots; on an ordinary LightningModule (one trial per process) they share
rung records with the other processes through a SQLite file or a database server. The rules themselves live in
:mod:`lightning_hydro.schedulers` (``SuccessiveHalvingRule``, ``AsyncSuccessiveHalving``, ``HyperbandRule``,
``DeadlinePolicy``); how a callback sees its trials, in :mod:`lightning_hydro.callbacks.trials_view`.
"""

import warnings
from typing import Any

from lightning_hydro.callbacks.asha import ASHA
from lightning_hydro.callbacks.deadline import Deadline
from lightning_hydro.callbacks.halving_callback import DEFAULT_STORE_FILE, HalvingCallback
from lightning_hydro.callbacks.hyperband import Hyperband
from lightning_hydro.callbacks.refill_source import RefillSource
from lightning_hydro.callbacks.successive_halving import SuccessiveHalving
from lightning_hydro.callbacks.trial_outcome import TrialOutcome, format_summary

__all__ = [
    "ASHA",
    "DEFAULT_STORE_FILE",
    "Deadline",
    "HalvingCallback",
    "Hyperband",
    "RefillSource",
    "SuccessiveHalving",
    "TrialOutcome",
    "format_summary",
]

# Old names, kept for one release: the trial's vocabulary now lives in lightning_hydro.schedulers.
_MOVED = {"OutcomeStatus": "TrialStatus", "TimeAttr": "TimeAttr"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        new = _MOVED[name]
        warnings.warn(
            f"lightning_hydro.callbacks.{name} is now lightning_hydro.schedulers.{new} (one name for a trial's "
            f"status and budget unit everywhere); import it from there. The old name will be removed in the next "
            "release.",
            DeprecationWarning,
            stacklevel=2,
        )
        from lightning_hydro import schedulers

        return getattr(schedulers, new)
    raise AttributeError(f"module 'lightning_hydro.callbacks' has no attribute {name!r}")
