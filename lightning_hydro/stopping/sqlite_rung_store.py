"""Rung records in an embedded SQLite file that every process on one machine can share at once."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from lightning_hydro.stopping._sql_codec import (
    RECORDS_TABLE,
    SETTINGS_TABLE,
    encode_trial_id,
    encode_value,
    record_from_row,
)
from lightning_hydro.stopping.rung_record import RungEntry, RungRecord
from lightning_hydro.stopping.rung_store import RungStore, StoreOpenError

T = TypeVar("T")

_COLUMNS = "sequence, trial_id, bracket, milestone, budget, value"
_SCHEMA = (
    f"""CREATE TABLE IF NOT EXISTS {RECORDS_TABLE} (
        sequence INTEGER PRIMARY KEY AUTOINCREMENT,
        namespace TEXT NOT NULL,
        bracket INTEGER NOT NULL,
        milestone INTEGER NOT NULL,
        trial_id TEXT NOT NULL,
        budget INTEGER NOT NULL,
        value REAL,
        UNIQUE (namespace, bracket, milestone, trial_id))""",
    f"""CREATE TABLE IF NOT EXISTS {SETTINGS_TABLE} (
        namespace TEXT NOT NULL,
        bracket INTEGER NOT NULL,
        settings TEXT NOT NULL,
        PRIMARY KEY (namespace, bracket))""",
)


class SqliteRungStore(RungStore):
    """Rung records in a SQLite file: no server, safe for many processes of one machine at once.

    Every append runs in a ``BEGIN IMMEDIATE`` transaction, which takes the file's write lock before
    reading, so appends from different processes are serialized and each sees all earlier ones. A process
    that finds the file locked waits (SQLite's busy timeout) and retries. Each process opens its own
    connection lazily (also after a fork), and the store pickles without it.

    SQLite's locking is unreliable on network filesystems (NFS): for processes on several machines use a
    database server URL (:class:`~lightning_hydro.stopping.sqlalchemy_rung_store.SqlAlchemyRungStore`).

    Args:
        path: The database file; created if missing. Its directory must exist and be writable.
        namespace: The sweep's name: records of other namespaces in the same file are invisible.
        timeout_s: How long one attempt waits for the write lock.
        retries: How many more attempts follow one that timed out.

    Raises:
        StoreOpenError: If the directory does not exist, or the file cannot be created or written.

    Example::

        >>> import tempfile, os
        >>> directory = tempfile.mkdtemp()
        >>> store = SqliteRungStore(os.path.join(directory, "asha.db"), namespace="sweep-1")
        >>> store.append([RungEntry(0, bracket=0, milestone=1, budget=1, value=0.3)]).stored[0].sequence
        1
        >>> store.close()
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        namespace: str = "default",
        timeout_s: float = 30.0,
        retries: int = 5,
    ) -> None:
        self.path = Path(path)
        self.namespace = namespace
        self.timeout_s = timeout_s
        self.retries = retries
        self._connection_: sqlite3.Connection | None = None
        self._pid = -1
        self._lock = threading.Lock()
        directory = self.path.parent
        if not directory.is_dir():
            raise StoreOpenError(
                f"SqliteRungStore: cannot create {str(self.path)!r}: the directory {str(directory)!r} "
                "does not "
                "exist. Create it first, or pass a path in an existing directory."
            )
        try:
            self._atomically(self._create_schema)
        except sqlite3.Error as exc:
            raise StoreOpenError(
                f"SqliteRungStore: cannot open {str(self.path)!r} for writing ({exc}). Check that the "
                "directory "
                f"{str(directory)!r} is writable and the path is not a directory, or pass another path."
            ) from exc

    @property
    def location(self) -> str:
        """The database file's path."""
        return str(self.path)

    def records(self, *, bracket: int | None = None, milestone: int | None = None) -> list[RungRecord]:
        """A snapshot of the stored records (see :meth:`RungStore.records`)."""
        query = f"SELECT {_COLUMNS} FROM {RECORDS_TABLE} WHERE namespace = ?"
        parameters: list[Any] = [self.namespace]
        if bracket is not None:
            query += " AND bracket = ?"
            parameters.append(bracket)
        if milestone is not None:
            query += " AND milestone = ?"
            parameters.append(milestone)
        return self._atomically(
            lambda connection: [
                record_from_row(row) for row in connection.execute(query + " ORDER BY sequence", parameters)
            ]
        )

    def state_dict(self) -> dict[str, Any]:
        """The file and namespace: the records themselves stay in the file."""
        return {"kind": "sqlite", "location": self.location, "namespace": self.namespace}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Check that ``state`` comes from a SQLite store; the records are already in the file."""
        self._check_state_kind(state, "sqlite")

    def close(self) -> None:
        """Close this process's connection (reopened on next use)."""
        if self._connection_ is not None and self._pid == os.getpid():
            self._connection_.close()
        self._connection_ = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_connection_=None, _pid=-1, _lock=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _connection(self) -> sqlite3.Connection:
        if self._connection_ is None or self._pid != os.getpid():
            # isolation_level=None: no implicit transactions; we issue BEGIN IMMEDIATE ourselves.
            self._connection_ = sqlite3.connect(
                self.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False
            )
            self._pid = os.getpid()
        return self._connection_

    def _atomically(self, work: Callable[[Any], T]) -> T:
        with self._lock:
            for attempt in range(self.retries + 1):
                connection = self._connection()
                try:
                    connection.execute("BEGIN IMMEDIATE")
                    try:
                        result = work(connection)
                        connection.execute("COMMIT")
                        return result
                    except BaseException:
                        if connection.in_transaction:
                            connection.execute("ROLLBACK")
                        raise
                except sqlite3.OperationalError as exc:
                    if not _is_busy(exc) or attempt == self.retries:
                        raise
                    time.sleep(0.05 * 2**attempt)
        raise AssertionError("unreachable")  # the loop returns or raises

    @staticmethod
    def _create_schema(connection: sqlite3.Connection) -> None:
        for statement in _SCHEMA:
            connection.execute(statement)

    def _find(self, handle: Any, entry: RungEntry) -> RungRecord | None:
        row = handle.execute(
            f"SELECT {_COLUMNS} FROM {RECORDS_TABLE} "
            "WHERE namespace = ? AND bracket = ? AND milestone = ? AND trial_id = ?",
            (self.namespace, entry.bracket, entry.milestone, encode_trial_id(entry.trial_id)),
        ).fetchone()
        return None if row is None else record_from_row(row)

    def _insert(self, handle: Any, entry: RungEntry) -> RungRecord:
        cursor = handle.execute(
            f"INSERT INTO {RECORDS_TABLE} (namespace, bracket, milestone, trial_id, budget, value) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (
                self.namespace,
                entry.bracket,
                entry.milestone,
                encode_trial_id(entry.trial_id),
                entry.budget,
                encode_value(entry.value),
            ),
        )
        sequence = cursor.lastrowid
        return RungRecord(entry.trial_id, entry.bracket, entry.milestone, entry.budget, entry.value, int(sequence))

    def _rung_records(self, handle: Any, bracket: int, milestone: int) -> list[RungRecord]:
        rows = handle.execute(
            f"SELECT {_COLUMNS} FROM {RECORDS_TABLE} WHERE namespace = ? AND bracket = ? AND milestone = ? "
            "ORDER BY sequence",
            (self.namespace, bracket, milestone),
        )
        return [record_from_row(row) for row in rows]

    def _read_settings(self, handle: Any, bracket: int) -> dict[str, Any] | None:
        row = handle.execute(
            f"SELECT settings FROM {SETTINGS_TABLE} WHERE namespace = ? AND bracket = ?",
            (self.namespace, bracket),
        ).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def _write_settings(self, handle: Any, bracket: int, settings: dict[str, Any]) -> None:
        handle.execute(
            f"INSERT INTO {SETTINGS_TABLE} (namespace, bracket, settings) VALUES (?, ?, ?)",
            (self.namespace, bracket, json.dumps(settings, sort_keys=True)),
        )


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    message = str(exc).lower()
    return "locked" in message or "busy" in message
