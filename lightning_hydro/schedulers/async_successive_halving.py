"""Moved to :mod:`lightning_hydro.stopping.async_successive_halving`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro.schedulers import _moved_names

__getattr__ = _moved_names(
    __name__,
    (
        "AsyncSuccessiveHalving",
        "TrialReport",
    ),
)
