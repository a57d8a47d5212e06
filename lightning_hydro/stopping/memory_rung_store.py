"""Rung records kept in this process: the store of a fused group, whose trials all report here."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from lightning_hydro.stopping.rung_record import RungEntry, RungRecord
from lightning_hydro.stopping.rung_store import RungKey, RungStore

T = TypeVar("T")


class MemoryRungStore(RungStore):
    """Records kept in this process: the store of a fused group, whose trials all report here.

    Args:
        namespace: Name of the sweep (kept for symmetry with the shared stores).

    Example::

        >>> store = MemoryRungStore()
        >>> result = store.append([RungEntry("a", 0, 1, 1, 0.5), RungEntry("b", 0, 1, 1, 0.7)])
        >>> [(record.trial_id, record.sequence) for record in result.rungs[(0, 1)]]
        [('a', 0), ('b', 1)]
        >>> store.append([RungEntry("a", 0, 1, 1, 0.5)]).inserted   # already there: a replay
        (False,)
    """

    def __init__(self, namespace: str = "default") -> None:
        self.namespace = namespace
        self._lock = threading.Lock()
        self._records: list[RungRecord] = []
        self._index: dict[tuple[int, int, Any], RungRecord] = {}
        self._by_rung: dict[RungKey, list[RungRecord]] = {}
        self._settings: dict[int, dict[str, Any]] = {}

    @property
    def location(self) -> str:
        """Always ``"memory"``."""
        return "memory"

    def records(self, *, bracket: int | None = None, milestone: int | None = None) -> list[RungRecord]:
        """A snapshot of the stored records (see :meth:`RungStore.records`)."""
        with self._lock:
            return [
                record
                for record in self._records
                if (bracket is None or record.bracket == bracket)
                and (milestone is None or record.milestone == milestone)
            ]

    def state_dict(self) -> dict[str, Any]:
        """Every record and claimed setting, as plain Python values."""
        with self._lock:
            return {
                "kind": "memory",
                "namespace": self.namespace,
                "records": [record.to_dict() for record in self._records],
                "settings": {str(bracket): dict(settings) for bracket, settings in self._settings.items()},
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace this store's contents with ``state``."""
        self._check_state_kind(state, "memory")
        records = [RungRecord.from_dict(dict(data)) for data in state["records"]]
        with self._lock:
            self.namespace = state["namespace"]
            self._records = records
            self._index = {(r.bracket, r.milestone, r.trial_id): r for r in records}
            self._by_rung = {}
            for record in records:
                self._by_rung.setdefault(record.rung_key, []).append(record)
            self._settings = {int(bracket): dict(value) for bracket, value in state["settings"].items()}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_lock"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _atomically(self, work: Callable[[Any], T]) -> T:
        with self._lock:
            return work(None)

    def _find(self, handle: Any, entry: RungEntry) -> RungRecord | None:
        return self._index.get((entry.bracket, entry.milestone, entry.trial_id))

    def _insert(self, handle: Any, entry: RungEntry) -> RungRecord:
        sequence = self._records[-1].sequence + 1 if self._records else 0
        record = RungRecord(entry.trial_id, entry.bracket, entry.milestone, entry.budget, entry.value, sequence)
        self._records.append(record)
        self._index[(entry.bracket, entry.milestone, entry.trial_id)] = record
        self._by_rung.setdefault(record.rung_key, []).append(record)
        return record

    def _rung_records(self, handle: Any, bracket: int, milestone: int) -> list[RungRecord]:
        return list(self._by_rung.get((bracket, milestone), []))

    def _read_settings(self, handle: Any, bracket: int) -> dict[str, Any] | None:
        return self._settings.get(bracket)

    def _write_settings(self, handle: Any, bracket: int, settings: dict[str, Any]) -> None:
        self._settings[bracket] = settings
