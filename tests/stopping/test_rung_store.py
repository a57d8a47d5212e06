import math
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest

from lightning_hydro.stopping import (
    MemoryRungStore,
    RungStore,
    SqlAlchemyRungStore,
    SqliteRungStore,
    StoreOpenError,
    StoreSettingsMismatchError,
)
from lightning_hydro.stopping.rung_record import RungEntry

pytest.importorskip("sqlalchemy")

StoreFactory = Callable[[str], RungStore]


@pytest.fixture(params=["memory", "sqlite", "sqlalchemy"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """A factory of stores of one kind; stores made with the same namespace share records (unless memory)."""
    kind = request.param
    memory_stores: dict[str, MemoryRungStore] = {}

    def make(namespace: str = "default") -> RungStore:
        if kind == "memory":
            return memory_stores.setdefault(namespace, MemoryRungStore(namespace))
        if kind == "sqlite":
            return SqliteRungStore(tmp_path / "rungs.db", namespace=namespace)
        return SqlAlchemyRungStore(f"sqlite:///{tmp_path / 'rungs-sa.db'}", namespace=namespace)

    return make


def test_append_returns_stored_records_and_the_rungs_they_touched(make_store: StoreFactory) -> None:
    store = make_store("default")
    result = store.append([RungEntry("a", 0, 1, 1, 0.5), RungEntry("b", 0, 1, 2, 0.7), RungEntry("a", 0, 3, 3, 0.4)])
    assert result.inserted == (True, True, True)
    sequences = [record.sequence for record in result.stored]
    assert sequences == sorted(sequences)
    assert len(set(sequences)) == 3
    assert [r.trial_id for r in result.rungs[(0, 1)]] == ["a", "b"]
    assert [r.trial_id for r in result.rungs[(0, 3)]] == ["a"]
    assert result.stored[1].budget == 2


def test_appending_a_stored_entry_again_returns_the_stored_record(make_store: StoreFactory) -> None:
    store = make_store("default")
    first = store.append([RungEntry("a", 0, 1, 1, 0.5)]).stored[0]
    store.append([RungEntry("b", 0, 1, 1, 0.6)])
    again = store.append([RungEntry("a", 0, 1, 1, 0.9)])  # a replay; the stored value wins
    assert again.inserted == (False,)
    assert again.stored[0] == first
    assert [r.trial_id for r in again.rungs[(0, 1)]] == ["a", "b"]


def test_records_filter_by_bracket_and_milestone(make_store: StoreFactory) -> None:
    store = make_store("default")
    store.append([RungEntry(1, 0, 1, 1, 0.1), RungEntry(1, 2, 9, 9, 0.2), RungEntry(2, 2, 9, 9, 0.3)])
    assert [r.trial_id for r in store.records(bracket=2)] == [1, 2]
    assert [r.value for r in store.records(milestone=1)] == [0.1]
    assert len(store.records()) == 3


def test_int_and_str_trial_ids_stay_distinct_and_diverged_values_round_trip(make_store: StoreFactory) -> None:
    store = make_store("default")
    store.append([RungEntry(3, 0, 1, 1, math.nan), RungEntry("3", 0, 1, 1, math.inf)])
    records = make_store("default").records()
    assert [r.trial_id for r in records] == [3, "3"]
    assert math.isnan(records[0].value)
    assert not math.isfinite(records[1].value)


def test_namespaces_do_not_see_each_other(make_store: StoreFactory) -> None:
    make_store("one").append([RungEntry("a", 0, 1, 1, 0.5)])
    assert make_store("two").records() == []
    assert len(make_store("one").records()) == 1


def test_settings_are_claimed_once_and_then_checked(make_store: StoreFactory) -> None:
    store = make_store("default")
    store.claim_settings(0, {"mode": "min", "max_t": 9})
    make_store("default").claim_settings(0, {"mode": "min", "max_t": 9})
    store.claim_settings(1, {"mode": "min", "max_t": 27})  # another bracket may differ
    with pytest.raises(StoreSettingsMismatchError, match=r"holds records made with \{'max_t': 9, 'mode': 'min'\}"):
        make_store("default").claim_settings(0, {"mode": "max", "max_t": 9})


def test_an_append_may_not_repeat_a_trial_at_a_rung(make_store: StoreFactory) -> None:
    with pytest.raises(ValueError, match=r"each trial may appear once per rung in one append, got \[\(0, 1, 'a'\)"):
        make_store("default").append([RungEntry("a", 0, 1, 1, 0.5), RungEntry("a", 0, 1, 2, 0.6)])


def test_state_dict_round_trip_and_kind_check(make_store: StoreFactory) -> None:
    store = make_store("default")
    store.append([RungEntry("a", 0, 1, 1, 0.5)])
    state = store.state_dict()
    restored = make_store("default") if state["kind"] != "memory" else MemoryRungStore()
    restored.load_state_dict(state)
    assert restored.records() == store.records()
    other_kind = {"kind": "memory" if state["kind"] != "memory" else "sqlite"}
    with pytest.raises(ValueError, match=r"the state was saved by a '\w+' store, but this is a '\w+' store"):
        store.load_state_dict(other_kind)


def test_memory_store_state_restores_sequences_and_settings() -> None:
    store = MemoryRungStore()
    store.claim_settings(0, {"mode": "min"})
    store.append([RungEntry("a", 0, 1, 1, 0.5), RungEntry("b", 0, 1, 1, 0.6)])
    restored = MemoryRungStore()
    restored.load_state_dict(store.state_dict())
    assert restored.append([RungEntry("c", 0, 1, 1, 0.7)]).stored[0].sequence == 2
    with pytest.raises(StoreSettingsMismatchError):
        restored.claim_settings(0, {"mode": "max"})


def test_shared_stores_pickle_without_their_connections(make_store: StoreFactory) -> None:
    store = make_store("default")
    store.append([RungEntry("a", 0, 1, 1, 0.5)])
    copy = pickle.loads(pickle.dumps(store))
    copy.append([RungEntry("b", 0, 1, 1, 0.6)])
    assert [r.trial_id for r in copy.records()] == ["a", "b"]
    with copy:
        pass  # closes; the next use reconnects
    assert len(copy.records()) == 2


def test_errors_show_a_server_url_without_its_password() -> None:
    with pytest.raises(StoreOpenError, match=r"cannot open the database 'nosuchdb://user:\*\*\*@host/db'") as error:
        SqlAlchemyRungStore("nosuchdb://user:secret@host/db")
    assert "secret" not in str(error.value)
