"""Moved to :mod:`lightning_hydro.stopping.rung_store`.

The old names resolve there for one release, with a ``DeprecationWarning``.
"""

from lightning_hydro.schedulers import _moved_names

__getattr__ = _moved_names(
    __name__,
    (
        "AppendResult",
        "RungKey",
        "RungStore",
        "RungStoreError",
        "StoreOpenError",
        "StoreSettingsMismatchError",
    ),
)
