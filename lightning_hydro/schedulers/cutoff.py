"""Moved to :mod:`lightning_hydro.stopping.cutoff`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro.schedulers import _moved_names

__getattr__ = _moved_names(
    __name__,
    (
        "Score",
        "judge_against_quantile",
        "judge_against_top_k",
        "quantile_score",
        "sort_scores",
        "to_score",
        "to_value",
        "top_k_score",
    ),
)
