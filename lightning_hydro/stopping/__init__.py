"""Pure decision logic for stopping trials early, and the vocabulary of a trial: no torch, no Lightning.

Rules: synchronous successive halving, ASHA (per trial or per batch), Hyperband brackets and a HyperSched-style
deadline policy. Rung records live in a :class:`RungStore`: in memory (a fused group), a SQLite file (processes
of one machine) or a database server (several machines). A trial's status, record and results
(:data:`TrialStatus`, :class:`TrialRecord`, :class:`TrialResult`) are shared by the fused module, the callbacks
in :mod:`lightning_hydro.callbacks` (which apply these decisions in a Trainer) and the sweeper.

The names below are the public API; helpers (cutoffs, bracket arithmetic, store records, group sizing) stay
importable from their modules.
"""

from lightning_hydro.stopping.async_successive_halving import AsyncSuccessiveHalving, TrialReport
from lightning_hydro.stopping.budget_accounting import BudgetSummary, successive_halving_budget, summarize_budget
from lightning_hydro.stopping.deadline_policy import DeadlinePolicy, TrialProgress
from lightning_hydro.stopping.decision import Decision
from lightning_hydro.stopping.group_sizing import LinearCost
from lightning_hydro.stopping.halving_config import HalvingConfig, Mode, TrialId
from lightning_hydro.stopping.hyperband import HyperbandRule, hyperband_brackets
from lightning_hydro.stopping.memory_rung_store import MemoryRungStore
from lightning_hydro.stopping.open_store import StoreSpec, open_store
from lightning_hydro.stopping.rung_store import (
    RungStore,
    RungStoreError,
    StoreOpenError,
    StoreSettingsMismatchError,
)
from lightning_hydro.stopping.sqlalchemy_rung_store import SqlAlchemyRungStore
from lightning_hydro.stopping.sqlite_rung_store import SqliteRungStore
from lightning_hydro.stopping.successive_halving import SuccessiveHalvingRule
from lightning_hydro.stopping.trial_record import TimeAttr, TrialRecord, TrialResult, TrialStatus

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
