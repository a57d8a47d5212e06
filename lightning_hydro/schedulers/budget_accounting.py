"""Moved to :mod:`lightning_hydro.stopping.budget_accounting`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro.schedulers import _moved_names

__getattr__ = _moved_names(
    __name__,
    (
        "BudgetSummary",
        "HalvingBudget",
        "successive_halving_budget",
        "summarize_budget",
    ),
)
