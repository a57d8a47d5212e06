"""Where rung records live: the interface every store implements, and its errors.

A store keeps :class:`~lightning_hydro.stopping.rung_record.RungRecord` objects under a *namespace* (one
sweep). Its one write, :meth:`RungStore.append`, is atomic: it adds records and reads back every record at
the rungs it touched in the same transaction, so a decision made from that snapshot is the one a
sequential run would make for the same arrival order, however many processes append at once. Appending
an entry whose ``(bracket, milestone, trial_id)`` is already stored changes nothing and returns the stored
record: a run resumed from a checkpoint can replay its reports and get the same decisions.

Implementations: ``MemoryRungStore`` (a fused group in one process), ``SqliteRungStore`` (a file shared
by the processes of one machine) and ``SqlAlchemyRungStore`` (a database server);
:func:`~lightning_hydro.stopping.open_store.open_store` picks one from a path or URL.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from lightning_hydro.stopping.rung_record import RungEntry, RungRecord

T = TypeVar("T")
RungKey = tuple[int, int]
"""``(bracket, milestone)``: names one rung."""


class RungStoreError(RuntimeError):
    """Base class of the errors a rung store raises."""


class StoreOpenError(RungStoreError):
    """The storage could not be opened (bad path or URL, missing package, unreachable server)."""


class StoreSettingsMismatchError(RungStoreError):
    """The namespace already holds records made under other rule settings (mode, eta, budgets)."""


@dataclass(frozen=True)
class AppendResult:
    """What :meth:`RungStore.append` saw, atomically.

    Attributes:
        stored: One record per appended entry, in the same order: the new record, or the one already
            stored for that ``(bracket, milestone, trial_id)``.
        inserted: For each entry, whether it was new.
        rungs: Every record at each rung the entries touched, in arrival order, as of the append.
    """

    stored: tuple[RungRecord, ...]
    inserted: tuple[bool, ...]
    rungs: dict[RungKey, tuple[RungRecord, ...]]


class RungStore(ABC):
    """Interface of rung storage. Subclasses provide the transaction and five small primitives.

    Attributes:
        namespace: The sweep whose records this store reads and writes.
    """

    namespace: str

    def append(self, entries: Sequence[RungEntry]) -> AppendResult:
        """Atomically record ``entries`` (skipping ones already stored) and read back their rungs.

        Raises:
            ValueError: If two entries name the same trial at the same rung.
        """
        keys = [(entry.bracket, entry.milestone, entry.trial_id) for entry in entries]
        if len(set(keys)) != len(keys):
            raise ValueError(
                f"{type(self).__name__}.append: each trial may appear once per rung in one append, got "
                f"{[key for key in keys if keys.count(key) > 1]} (bracket, milestone, trial_id) repeated."
            )

        def work(handle: Any) -> AppendResult:
            stored, inserted = [], []
            for entry in entries:
                existing = self._find(handle, entry)
                stored.append(existing if existing is not None else self._insert(handle, entry))
                inserted.append(existing is None)
            rung_keys = dict.fromkeys(entry.rung_key for entry in entries)
            rungs = {key: tuple(self._rung_records(handle, *key)) for key in rung_keys}
            return AppendResult(tuple(stored), tuple(inserted), rungs)

        return self._atomically(work)

    def claim_settings(self, bracket: int, settings: Mapping[str, Any]) -> None:
        """Record the rule settings of ``bracket``'s rungs, or check them against those already recorded.

        Every process of a sweep must judge a rung by the same rule; this catches one that does not.

        Raises:
            StoreSettingsMismatchError: If the namespace's bracket was claimed with other settings.
        """
        wanted = dict(sorted(settings.items()))

        def work(handle: Any) -> None:
            existing = self._read_settings(handle, bracket)
            if existing is None:
                self._write_settings(handle, bracket, wanted)
            elif existing != wanted:
                existing = dict(sorted(existing.items()))
                raise StoreSettingsMismatchError(
                    f"{type(self).__name__}: namespace {self.namespace!r} (bracket {bracket}) in "
                    f"{self.location} "
                    f"holds records made with {existing}, but this rule uses {wanted}. Use the same "
                    "settings in every process of a sweep, or give this sweep its own namespace or storage."
                )

        self._atomically(work)

    @abstractmethod
    def records(self, *, bracket: int | None = None, milestone: int | None = None) -> list[RungRecord]:
        """A snapshot of the stored records, optionally of one bracket and/or milestone, in arrival order."""

    @property
    @abstractmethod
    def location(self) -> str:
        """Where the records live, for messages (``"memory"``, a file path, a URL without password)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must keep: all records for a memory store, only the address for shared ones."""

    @abstractmethod
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def close(self) -> None:  # noqa: B027 (optional hook: only stores with connections override it)
        """Release connections; the store reconnects if used again."""

    def __enter__(self) -> RungStore:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    # Primitives, called inside `_atomically` with its handle.
    @abstractmethod
    def _atomically(self, work: Callable[[Any], T]) -> T:
        """Run ``work(handle)`` as one transaction that excludes every other writer of the namespace."""

    @abstractmethod
    def _find(self, handle: Any, entry: RungEntry) -> RungRecord | None: ...

    @abstractmethod
    def _insert(self, handle: Any, entry: RungEntry) -> RungRecord: ...

    @abstractmethod
    def _rung_records(self, handle: Any, bracket: int, milestone: int) -> list[RungRecord]: ...

    @abstractmethod
    def _read_settings(self, handle: Any, bracket: int) -> dict[str, Any] | None: ...

    @abstractmethod
    def _write_settings(self, handle: Any, bracket: int, settings: dict[str, Any]) -> None: ...

    def _check_state_kind(self, state: Mapping[str, Any], kind: str) -> None:
        if state.get("kind") != kind:
            raise ValueError(
                f"{type(self).__name__}.load_state_dict: the state was saved by a {state.get('kind')!r} "
                "store, "
                f"but this is a {kind!r} store. Resume with the storage the run was started with."
            )
