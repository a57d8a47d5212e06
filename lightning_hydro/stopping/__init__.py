"""Pure decision logic for stopping trials early, and the vocabulary of a trial: no torch, no Lightning.

Rules: synchronous successive halving, ASHA (per trial or per batch), Hyperband brackets and a HyperSched-style
deadline policy. Rung records live in a :class:`RungStore`: in memory (a fused group), a SQLite file (processes
of one machine) or a database server (several machines). A trial's status, record and results
(:data:`TrialStatus`, :class:`TrialRecord`, :class:`TrialResult`) are shared by the fused module, the callbacks
in :mod:`lightning_hydro.callbacks` (which apply these decisions in a Trainer) and the sweeper.

The names below are the public API; helpers (cutoffs, bracket arithmetic, store records, group sizing) stay
importable from their modules.
"""

from lightning_hydro._deprecation import Renamed, renamed_names
from lightning_hydro.schedulers.async_successive_halving import AsyncSuccessiveHalving, TrialReport
from lightning_hydro.schedulers.budget_accounting import BudgetSummary, successive_halving_budget, summarize_budget
from lightning_hydro.schedulers.deadline_policy import DeadlinePolicy, TrialProgress
from lightning_hydro.schedulers.decision import Decision
from lightning_hydro.schedulers.group_sizing import LinearCost
from lightning_hydro.schedulers.halving_config import HalvingConfig, Mode, TrialId
from lightning_hydro.schedulers.hyperband import HyperbandRule, hyperband_brackets
from lightning_hydro.schedulers.memory_rung_store import MemoryRungStore
from lightning_hydro.schedulers.open_store import StoreSpec, open_store
from lightning_hydro.schedulers.rung_store import (
    RungStore,
    RungStoreError,
    StoreOpenError,
    StoreSettingsMismatchError,
)
from lightning_hydro.schedulers.sqlalchemy_rung_store import SqlAlchemyRungStore
from lightning_hydro.schedulers.sqlite_rung_store import SqliteRungStore
from lightning_hydro.schedulers.successive_halving import SuccessiveHalvingRule
from lightning_hydro.schedulers.trial_record import TimeAttr, TrialRecord, TrialResult, TrialStatus

__all__ = [
    "AsyncSuccessiveHalving",
    "BudgetSummary",
    "DeadlinePolicy",
    "Decision",
    "HalvingConfig",
    "HyperbandRule",
    "LinearCost",
    "MemoryRungStore",
    "Mode",
    "RungStore",
    "RungStoreError",
    "SqlAlchemyRungStore",
    "SqliteRungStore",
    "StoreOpenError",
    "StoreSettingsMismatchError",
    "StoreSpec",
    "SuccessiveHalvingRule",
    "TimeAttr",
    "TrialId",
    "TrialProgress",
    "TrialRecord",
    "TrialReport",
    "TrialResult",
    "TrialStatus",
    "hyperband_brackets",
    "open_store",
    "successive_halving_budget",
    "summarize_budget",
]

# Old names, kept for one release: the rules shared their names with the callbacks of lightning_hydro.callbacks.
__getattr__ = renamed_names(
    __name__,
    {
        old: Renamed(
            f"{__name__}:{new}",
            f"is renamed {new} (lightning_hydro.callbacks.{old} is the callback); import {new} instead",
        )
        for old, new in {"SuccessiveHalving": "SuccessiveHalvingRule", "Hyperband": "HyperbandRule"}.items()
    },
)
