"""Pick a rung store from what the user passed: nothing, a path, a URL, or a store."""

from __future__ import annotations

import os
import re

from lightning_hydro.stopping.memory_rung_store import MemoryRungStore
from lightning_hydro.stopping.rung_store import RungStore, StoreOpenError
from lightning_hydro.stopping.sqlite_rung_store import SqliteRungStore

StoreSpec = RungStore | str | os.PathLike[str] | None
"""What :func:`open_store` accepts."""

_URL_SCHEME = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]+):")  # 2+ letters: "C:\..." stays a path
_SQLITE_PREFIX = "sqlite:///"


def open_store(spec: StoreSpec = None, *, namespace: str = "default") -> RungStore:
    """Open the rung store that ``spec`` names.

    - ``None``: a :class:`~lightning_hydro.stopping.memory_rung_store.MemoryRungStore` (one process; a fused
      group).
    - a path (``str`` without a URL scheme, or ``os.PathLike``), or a ``"sqlite:///relative.db"`` /
      ``"sqlite:////absolute.db"`` URL: a
      :class:`~lightning_hydro.stopping.sqlite_rung_store.SqliteRungStore` on that file, shared by the
      processes of one machine. Needs nothing beyond Python.
    - any other URL, e.g. ``"postgresql://user@host/db"``: a
      :class:`~lightning_hydro.stopping.sqlalchemy_rung_store.SqlAlchemyRungStore` (needs
      ``pip install sqlalchemy`` and the database's driver).
    - a :class:`~lightning_hydro.stopping.rung_store.RungStore`: returned unchanged.

    Args:
        spec: See above.
        namespace: The sweep's name inside the file or database (ignored for a store object).

    Raises:
        StoreOpenError: If the path or URL cannot be opened (missing directory, read-only location,
            malformed URL, SQLAlchemy or a driver missing, unreachable server).
        TypeError: If ``spec`` is of another type.

    Example::

        >>> open_store(None).location
        'memory'
        >>> import tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "asha.db")
        >>> type(open_store("sqlite:///" + path)).__name__, type(open_store(path)).__name__
        ('SqliteRungStore', 'SqliteRungStore')
    """
    if spec is None:
        return MemoryRungStore(namespace)
    if isinstance(spec, RungStore):
        return spec
    if isinstance(spec, os.PathLike):
        return SqliteRungStore(spec, namespace=namespace)
    if not isinstance(spec, str):
        raise TypeError(
            f"open_store: expected None, a path, a database URL or a RungStore, got {type(spec).__name__} "
            f"{spec!r}. Pass e.g. None (in memory), 'asha.db' or 'postgresql://user@host/db'."
        )
    if not spec:
        raise StoreOpenError(
            "open_store: got an empty string. Pass None for an in-memory store, or a file path or URL."
        )
    match = _URL_SCHEME.match(spec)
    if match is None:
        return SqliteRungStore(spec, namespace=namespace)
    if match.group("scheme") == "sqlite":
        return SqliteRungStore(_sqlite_url_path(spec), namespace=namespace)
    if "://" not in spec:
        raise StoreOpenError(
            f"open_store: malformed database URL {spec!r}: expected 'dialect://...', e.g. "
            "'postgresql://user:password@host/database' or 'sqlite:///path/to/file.db'."
        )
    from lightning_hydro.stopping.sqlalchemy_rung_store import SqlAlchemyRungStore

    return SqlAlchemyRungStore(spec, namespace=namespace)


def _sqlite_url_path(url: str) -> str:
    path = url[len(_SQLITE_PREFIX) :] if url.startswith(_SQLITE_PREFIX) else ""
    if not path or "?" in path:
        raise StoreOpenError(
            f"open_store: malformed SQLite URL {url!r}: expected 'sqlite:///relative/path.db' or "
            "'sqlite:////absolute/path.db' (three slashes, then the path; no '?options'). For options, "
            "create SqlAlchemyRungStore(url) yourself."
        )
    return path
