"""Pure decision logic for stopping trials early: no torch, no Lightning.

Rules: synchronous successive halving, ASHA (per trial or per batch), Hyperband brackets, a
HyperSched-style deadline policy, and Fluid-style group sizing. Rung records live in a
:class:`RungStore`: in memory (a fused group), a SQLite file (processes of one machine) or a database
server (several machines). Callbacks in :mod:`lightning_hydro.callbacks` apply these decisions in a Trainer.
"""

from lightning_hydro.schedulers.async_successive_halving import AsyncSuccessiveHalving, TrialReport
from lightning_hydro.schedulers.budget_accounting import (
    BudgetSummary,
    HalvingBudget,
    successive_halving_budget,
    summarize_budget,
)
from lightning_hydro.schedulers.cutoff import judge_against_quantile, judge_against_top_k
from lightning_hydro.schedulers.deadline_policy import (
    DeadlinePlan,
    DeadlinePolicy,
    SecondsPerUnit,
    TrialProgress,
)
from lightning_hydro.schedulers.decision import Action, Decision, Reason
from lightning_hydro.schedulers.group_sizing import (
    GroupSizePlan,
    LinearCost,
    PredictionCheck,
    check_prediction,
    plan_group_size,
)
from lightning_hydro.schedulers.halving_config import HalvingConfig, Mode, Rounding, TrialId, keep_count
from lightning_hydro.schedulers.hyperband import (
    BracketOrder,
    Hyperband,
    HyperbandBracket,
    HyperbandRung,
    assign_to_brackets,
    bracket_for_position,
    hyperband_brackets,
)
from lightning_hydro.schedulers.memory_rung_store import MemoryRungStore
from lightning_hydro.schedulers.open_store import StoreSpec, open_store
from lightning_hydro.schedulers.rung_record import RungEntry, RungRecord
from lightning_hydro.schedulers.rung_store import (
    AppendResult,
    RungStore,
    RungStoreError,
    StoreOpenError,
    StoreSettingsMismatchError,
)
from lightning_hydro.schedulers.sqlalchemy_rung_store import SqlAlchemyRungStore
from lightning_hydro.schedulers.sqlite_rung_store import SqliteRungStore
from lightning_hydro.schedulers.successive_halving import SuccessiveHalving

__all__ = [
    "Action",
    "AppendResult",
    "AsyncSuccessiveHalving",
    "BracketOrder",
    "BudgetSummary",
    "DeadlinePlan",
    "DeadlinePolicy",
    "Decision",
    "GroupSizePlan",
    "HalvingBudget",
    "HalvingConfig",
    "Hyperband",
    "HyperbandBracket",
    "HyperbandRung",
    "LinearCost",
    "MemoryRungStore",
    "Mode",
    "PredictionCheck",
    "Reason",
    "Rounding",
    "RungEntry",
    "RungRecord",
    "RungStore",
    "RungStoreError",
    "SecondsPerUnit",
    "SqlAlchemyRungStore",
    "SqliteRungStore",
    "StoreOpenError",
    "StoreSettingsMismatchError",
    "StoreSpec",
    "SuccessiveHalving",
    "TrialId",
    "TrialProgress",
    "TrialReport",
    "assign_to_brackets",
    "bracket_for_position",
    "check_prediction",
    "hyperband_brackets",
    "judge_against_quantile",
    "judge_against_top_k",
    "keep_count",
    "open_store",
    "plan_group_size",
    "successive_halving_budget",
    "summarize_budget",
]
