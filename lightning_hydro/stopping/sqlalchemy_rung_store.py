"""Rung records in a database server (PostgreSQL, MySQL, ...) through SQLAlchemy, for several machines.

SQLAlchemy is an optional dependency: this module imports it only when a store is created.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from lightning_hydro.stopping._sql_codec import (
    LOCKS_TABLE,
    RECORDS_TABLE,
    SETTINGS_TABLE,
    encode_trial_id,
    encode_value,
    record_from_row,
)
from lightning_hydro.stopping.rung_record import RungEntry, RungRecord
from lightning_hydro.stopping.rung_store import RungStore, StoreOpenError

if TYPE_CHECKING:
    import sqlalchemy

T = TypeVar("T")
INSTALL_HINT = "pip install sqlalchemy"


class SqlAlchemyRungStore(RungStore):
    """Rung records in any database SQLAlchemy can reach, shared by processes on several machines.

    Appends are serialized per namespace: each transaction first updates the namespace's row in a lock
    table, which holds that row's write lock until commit (PostgreSQL, MySQL/InnoDB and SQLite all do), so
    each append sees every append committed before it. On SQLite the transaction also begins with
    ``BEGIN IMMEDIATE``. Failed attempts (lock timeouts, deadlocks, a busy file) are retried.

    Args:
        url: A SQLAlchemy URL, e.g. ``"postgresql://user:password@host/tuning"`` or ``"sqlite:///asha.db"``.
            The database driver (psycopg, pymysql, ...) must be installed.
        namespace: The sweep's name: records of other namespaces in the same database are invisible.
        retries: How many more attempts follow one that failed on a lock.
        engine_options: Extra keyword arguments for ``sqlalchemy.create_engine``.

    Raises:
        StoreOpenError: If SQLAlchemy or the driver is missing, the URL cannot be parsed, or the database
            cannot be reached or written.

    Example::

        >>> import tempfile, os
        >>> url = "sqlite:///" + os.path.join(tempfile.mkdtemp(), "asha.db")
        >>> store = SqlAlchemyRungStore(url)
        >>> store.append([RungEntry("t1", bracket=0, milestone=1, budget=1, value=0.4)]).inserted
        (True,)
        >>> store.close()
    """

    def __init__(
        self,
        url: str,
        *,
        namespace: str = "default",
        retries: int = 5,
        engine_options: Mapping[str, Any] | None = None,
    ) -> None:
        sa = import_sqlalchemy(url)
        self.namespace = namespace
        self.retries = retries
        self._url = url
        self._engine_options = dict(engine_options or {})
        self._lock = threading.Lock()
        try:
            parsed = sa.engine.make_url(url)
        except (sa.exc.ArgumentError, ValueError) as exc:
            raise StoreOpenError(
                f"SqlAlchemyRungStore: cannot parse the database URL {url!r} ({exc}). Expected "
                "'dialect+driver://user:password@host:port/database', e.g. 'postgresql://me@db-host/tuning'."
            ) from exc
        self._safe_url = parsed.render_as_string(hide_password=True)
        self._sa = sa
        self._tables = _define_tables(sa)
        if parsed.get_backend_name() == "sqlite":
            # Wait for the file's write lock like SqliteRungStore does (pysqlite's default is 5 s).
            self._engine_options.setdefault("connect_args", {"timeout": 30.0})
        self._engine: sqlalchemy.engine.Engine | None = None
        self._pid = -1
        try:
            self._atomically(self._create_schema, lock_namespace=False)
        except (ImportError, sa.exc.SQLAlchemyError) as exc:
            raise StoreOpenError(
                f"SqlAlchemyRungStore: cannot open the database {self._safe_url!r} ({exc}). Check that the "
                "driver is installed, the server is reachable and the user may create tables."
            ) from exc

    @property
    def location(self) -> str:
        """The URL, password hidden."""
        return self._safe_url

    def records(self, *, bracket: int | None = None, milestone: int | None = None) -> list[RungRecord]:
        """A snapshot of the stored records (see :meth:`RungStore.records`)."""
        records = self._tables["records"]
        query = self._select_records().where(records.c.namespace == self.namespace)
        if bracket is not None:
            query = query.where(records.c.bracket == bracket)
        if milestone is not None:
            query = query.where(records.c.milestone == milestone)
        with self._engine_().connect() as connection:
            return [record_from_row(row) for row in connection.execute(query.order_by(records.c.sequence))]

    def state_dict(self) -> dict[str, Any]:
        """The URL (password hidden) and namespace: the records stay in the database."""
        return {"kind": "sqlalchemy", "location": self.location, "namespace": self.namespace}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Check that ``state`` comes from a SQLAlchemy store; the records are already in the database."""
        self._check_state_kind(state, "sqlalchemy")

    def close(self) -> None:
        """Dispose of the connection pool (recreated on next use)."""
        if self._engine is not None:
            self._engine.dispose(close=self._pid == os.getpid())
        self._engine = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_engine=None, _pid=-1, _lock=None, _sa=None, _tables=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._sa = import_sqlalchemy(self._url)
        self._tables = _define_tables(self._sa)

    def _engine_(self) -> sqlalchemy.engine.Engine:
        if self._engine is not None and self._pid != os.getpid():
            # A forked child must not use its parent's pooled connections.
            self._engine.dispose(close=False)
            self._engine = None
        if self._engine is None:
            sa = self._sa
            engine = sa.create_engine(self._url, **self._engine_options)
            if engine.dialect.name == "sqlite":
                _begin_immediately(sa, engine)
            self._engine = engine
            self._pid = os.getpid()
        return self._engine

    def _atomically(self, work: Callable[[Any], T], *, lock_namespace: bool = True) -> T:
        sa = self._sa
        with self._lock:
            for attempt in range(self.retries + 1):
                try:
                    with self._engine_().begin() as connection:
                        if lock_namespace:
                            self._lock_namespace(connection)
                        return work(connection)
                except (sa.exc.OperationalError, sa.exc.IntegrityError, sa.exc.ProgrammingError):
                    # Lock timeouts, deadlocks, busy files; two processes creating the same lock row or
                    # the same tables at once. Each attempt starts a fresh transaction.
                    if attempt == self.retries:
                        raise
                    time.sleep(0.05 * 2**attempt)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _lock_namespace(self, connection: Any) -> None:
        locks = self._tables["locks"]
        sa = self._sa
        updated = connection.execute(
            sa.update(locks).where(locks.c.namespace == self.namespace).values(generation=locks.c.generation + 1)
        ).rowcount
        if updated == 0:  # first use of the namespace; a racing creator makes this fail and retry
            connection.execute(sa.insert(locks).values(namespace=self.namespace, generation=1))

    def _create_schema(self, connection: Any) -> None:
        self._tables["metadata"].create_all(connection)

    def _select_records(self) -> Any:
        records = self._tables["records"]
        return self._sa.select(
            records.c.sequence,
            records.c.trial_id,
            records.c.bracket,
            records.c.milestone,
            records.c.budget,
            records.c.value,
        )

    def _find(self, handle: Any, entry: RungEntry) -> RungRecord | None:
        records = self._tables["records"]
        row = handle.execute(
            self._select_records().where(
                records.c.namespace == self.namespace,
                records.c.bracket == entry.bracket,
                records.c.milestone == entry.milestone,
                records.c.trial_id == encode_trial_id(entry.trial_id),
            )
        ).first()
        return None if row is None else record_from_row(row)

    def _insert(self, handle: Any, entry: RungEntry) -> RungRecord:
        records = self._tables["records"]
        result = handle.execute(
            self._sa.insert(records).values(
                namespace=self.namespace,
                bracket=entry.bracket,
                milestone=entry.milestone,
                trial_id=encode_trial_id(entry.trial_id),
                budget=entry.budget,
                value=encode_value(entry.value),
            )
        )
        sequence = int(result.inserted_primary_key[0])
        return RungRecord(entry.trial_id, entry.bracket, entry.milestone, entry.budget, entry.value, sequence)

    def _rung_records(self, handle: Any, bracket: int, milestone: int) -> list[RungRecord]:
        records = self._tables["records"]
        query = self._select_records().where(
            records.c.namespace == self.namespace,
            records.c.bracket == bracket,
            records.c.milestone == milestone,
        )
        return [record_from_row(row) for row in handle.execute(query.order_by(records.c.sequence))]

    def _read_settings(self, handle: Any, bracket: int) -> dict[str, Any] | None:
        settings = self._tables["settings"]
        row = handle.execute(
            self._sa.select(settings.c.settings).where(
                settings.c.namespace == self.namespace, settings.c.bracket == bracket
            )
        ).first()
        return None if row is None else dict(json.loads(row[0]))

    def _write_settings(self, handle: Any, bracket: int, settings: dict[str, Any]) -> None:
        table = self._tables["settings"]
        handle.execute(
            self._sa.insert(table).values(
                namespace=self.namespace, bracket=bracket, settings=json.dumps(settings, sort_keys=True)
            )
        )


def import_sqlalchemy(url: str) -> Any:
    """The ``sqlalchemy`` module, or a StoreOpenError that says how to install it."""
    try:
        import sqlalchemy
    except ImportError as exc:
        raise StoreOpenError(
            f"The storage URL {url!r} needs SQLAlchemy, which is not installed. Install it with "
            f"`{INSTALL_HINT}` (plus the database driver, e.g. `pip install psycopg` for PostgreSQL), "
            "or pass "
            "a SQLite file path to share records between processes of one machine."
        ) from exc
    return sqlalchemy


def _define_tables(sa: Any) -> dict[str, Any]:
    metadata = sa.MetaData()
    records = sa.Table(
        RECORDS_TABLE,
        metadata,
        sa.Column("sequence", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("namespace", sa.String(255), nullable=False),
        sa.Column("bracket", sa.Integer, nullable=False),
        sa.Column("milestone", sa.Integer, nullable=False),
        sa.Column("trial_id", sa.String(255), nullable=False),
        sa.Column("budget", sa.Integer, nullable=False),
        sa.Column("value", sa.Float(precision=53), nullable=True),
        sa.UniqueConstraint("namespace", "bracket", "milestone", "trial_id"),
    )
    settings = sa.Table(
        SETTINGS_TABLE,
        metadata,
        sa.Column("namespace", sa.String(255), primary_key=True),
        sa.Column("bracket", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("settings", sa.Text, nullable=False),
    )
    locks = sa.Table(
        LOCKS_TABLE,
        metadata,
        sa.Column("namespace", sa.String(255), primary_key=True),
        sa.Column("generation", sa.Integer, nullable=False),
    )
    return {"metadata": metadata, "records": records, "settings": settings, "locks": locks}


def _begin_immediately(sa: Any, engine: Any) -> None:
    """Make pysqlite take the write lock at BEGIN (SQLAlchemy's documented recipe for SQLite)."""

    @sa.event.listens_for(engine, "connect")
    def _no_implicit_begin(dbapi_connection: Any, connection_record: Any) -> None:
        dbapi_connection.isolation_level = None

    @sa.event.listens_for(engine, "begin")
    def _begin_immediate(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")
