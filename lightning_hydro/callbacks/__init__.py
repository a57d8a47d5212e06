"""Lightning callbacks that stop trials early: successive halving, ASHA, Hyperband and a deadline (HyperSched).

On a :class:`~lightning_hydro.FusedLightningModule` they stop losing trials through its slot API (the group
really shrinks) and can refill freed slots; on an ordinary LightningModule (one trial per process) they share
rung records with the other processes through a SQLite file or a database server. The rules themselves live in
:mod:`lightning_hydro.stopping` (``SuccessiveHalvingRule``, ``AsyncSuccessiveHalving``, ``HyperbandRule``,
``DeadlinePolicy``); how a callback sees its trials, in :mod:`lightning_hydro.callbacks.trials_view`.
"""

from lightning_hydro._deprecation import Renamed, renamed_names
from lightning_hydro.callbacks.asha import ASHA
from lightning_hydro.callbacks.deadline import Deadline
from lightning_hydro.callbacks.halving_callback import DEFAULT_STORE_FILE, HalvingCallback
from lightning_hydro.callbacks.hyperband import Hyperband
from lightning_hydro.callbacks.refill_source import RefillSource
from lightning_hydro.callbacks.successive_halving import SuccessiveHalving
from lightning_hydro.callbacks.trial_ending import TrialEnding, format_summary

__all__ = [
    "ASHA",
    "DEFAULT_STORE_FILE",
    "Deadline",
    "HalvingCallback",
    "Hyperband",
    "RefillSource",
    "SuccessiveHalving",
    "TrialEnding",
    "format_summary",
]

# Old names, kept for one release.
_WHY_MOVED = "(one name for a trial's status and budget unit everywhere); import it from there"
__getattr__ = renamed_names(
    __name__,
    {
        "OutcomeStatus": Renamed(
            "lightning_hydro.stopping:TrialStatus", f"is now lightning_hydro.stopping.TrialStatus {_WHY_MOVED}"
        ),
        "TimeAttr": Renamed(
            "lightning_hydro.stopping:TimeAttr", f"is now lightning_hydro.stopping.TimeAttr {_WHY_MOVED}"
        ),
        "TrialOutcome": Renamed(
            "lightning_hydro.callbacks.trial_ending:TrialEnding",
            "is renamed TrialEnding (how a callback ended a trial; the sweeper's samplers are told a "
            "SamplerFeedback); import lightning_hydro.callbacks.TrialEnding",
        ),
    },
)
