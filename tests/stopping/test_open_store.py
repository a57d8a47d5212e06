import os
import sys
from pathlib import Path

import pytest

from lightning_hydro.stopping import MemoryRungStore, SqlAlchemyRungStore, SqliteRungStore, StoreOpenError, open_store


def test_none_gives_a_memory_store_and_a_store_passes_through() -> None:
    store = open_store(None, namespace="sweep")
    assert isinstance(store, MemoryRungStore)
    assert store.namespace == "sweep"
    assert open_store(store) is store


def test_paths_and_sqlite_urls_give_a_sqlite_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert isinstance(open_store("relative.db"), SqliteRungStore)
    assert isinstance(open_store(tmp_path / "pathlike.db"), SqliteRungStore)
    relative = open_store("sqlite:///from-url.db")
    absolute = open_store(f"sqlite:///{tmp_path / 'absolute.db'}", namespace="n")
    assert isinstance(relative, SqliteRungStore)
    assert relative.location == "from-url.db"
    assert isinstance(absolute, SqliteRungStore)
    assert absolute.location == str(tmp_path / "absolute.db")
    assert absolute.namespace == "n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "absolute.db",
        "from-url.db",
        "pathlike.db",
        "relative.db",
    ]


def test_other_urls_go_through_sqlalchemy(tmp_path: Path) -> None:
    pytest.importorskip("sqlalchemy")
    store = open_store(f"sqlite+pysqlite:///{tmp_path / 'sa.db'}")
    assert isinstance(store, SqlAlchemyRungStore)


def test_a_path_in_a_missing_directory(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such"
    with pytest.raises(StoreOpenError, match=r"the directory '.*no/such' does not exist\. Create it first"):
        open_store(str(missing / "asha.db"))
    with pytest.raises(StoreOpenError, match=r"does not exist"):
        open_store(f"sqlite:///{missing / 'asha.db'}")


def test_a_path_where_no_file_can_be_written() -> None:
    if not Path("/proc").is_dir():
        pytest.skip("needs Linux's read-only /proc")
    with pytest.raises(StoreOpenError, match=r"cannot open '/proc/asha.db' for writing \(.*\)\. Check that the dir"):
        open_store("/proc/asha.db")


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may write anywhere")
def test_a_path_in_a_read_only_directory(tmp_path: Path) -> None:
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o500)
    try:
        with pytest.raises(StoreOpenError, match=r"cannot open .* for writing .*is writable"):
            open_store(read_only / "asha.db")
    finally:
        read_only.chmod(0o700)


def test_a_directory_is_not_a_database(tmp_path: Path) -> None:
    with pytest.raises(StoreOpenError, match=r"for writing .*the path is not a directory"):
        open_store(tmp_path)


@pytest.mark.parametrize("url", ["sqlite:/x.db", "sqlite://", "sqlite:///", "sqlite:///x.db?timeout=3"])
def test_malformed_sqlite_urls(url: str) -> None:
    with pytest.raises(StoreOpenError, match=r"malformed SQLite URL .*expected 'sqlite:///relative/path.db'"):
        open_store(url)


def test_malformed_server_urls() -> None:
    with pytest.raises(StoreOpenError, match=r"malformed database URL 'postgresql:host/db': expected 'dialect://"):
        open_store("postgresql:host/db")
    pytest.importorskip("sqlalchemy")
    with pytest.raises(StoreOpenError, match=r"cannot parse the database URL 'postgresql://u@h:port/db'"):
        open_store("postgresql://u@h:port/db")


def test_unknown_dialect_or_missing_driver() -> None:
    pytest.importorskip("sqlalchemy")
    with pytest.raises(StoreOpenError, match=r"cannot open the database 'nosuchdb://host/db' .*driver is installed"):
        open_store("nosuchdb://host/db")


def test_missing_sqlalchemy_names_the_pip_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sqlalchemy", None)  # makes `import sqlalchemy` raise ImportError
    with pytest.raises(
        StoreOpenError,
        match=r"needs SQLAlchemy, which is not installed\. Install it with `pip install sqlalchemy`",
    ):
        open_store("postgresql://user@host/db")


def test_empty_and_wrongly_typed_specs() -> None:
    with pytest.raises(StoreOpenError, match=r"open_store: got an empty string\. Pass None"):
        open_store("")
    with pytest.raises(TypeError, match=r"open_store: expected None, a path, a database URL or a RungStore, got int"):
        open_store(3)  # type: ignore[arg-type]
