"""system/sqlite.py: one way to open a database (busy timeout, WAL, synchronous, owner-only) and one
transaction (BEGIN IMMEDIATE, COMMIT, ROLLBACK on an exception)."""

import os
import sqlite3
import stat

import pytest

from system.sqlite import BUSY_TIMEOUT_SECONDS, connect, transaction


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def conn(tmp_path):
    db = connect(tmp_path / "state" / "x.sqlite3", synchronous="NORMAL")
    db.execute("CREATE TABLE t (v INTEGER)")
    yield db
    db.close()


def _values(db) -> list[int]:
    return [v for (v,) in db.execute("SELECT v FROM t ORDER BY v")]


def test_commit_when_the_block_ends(conn):
    with transaction(conn) as db:
        assert db is conn and conn.in_transaction
        db.execute("INSERT INTO t VALUES (1)")
    assert not conn.in_transaction and _values(conn) == [1]


def test_rollback_when_the_block_raises_and_the_error_comes_through(conn):
    with pytest.raises(ZeroDivisionError), transaction(conn):
        conn.execute("INSERT INTO t VALUES (1)")
        1 / 0  # noqa: B018
    assert not conn.in_transaction and _values(conn) == []
    with transaction(conn):  # the connection is usable again
        conn.execute("INSERT INTO t VALUES (2)")
    assert _values(conn) == [2]


def test_a_block_that_ended_the_transaction_itself_does_not_hide_its_error(conn):
    with pytest.raises(sqlite3.OperationalError, match="no such table"), transaction(conn):
        conn.execute("ROLLBACK")
        conn.execute("SELECT * FROM missing")


def test_immediate_takes_the_write_lock_at_begin(tmp_path):
    path = tmp_path / "x.sqlite3"
    first, second = connect(path, synchronous="FULL"), connect(path, synchronous="FULL")
    second.execute("PRAGMA busy_timeout=0")  # fail at once instead of waiting the project's timeout
    with transaction(first):
        with pytest.raises(sqlite3.OperationalError, match="locked"), transaction(second):
            pass
        with transaction(second, immediate=False):  # a deferred BEGIN takes no lock yet
            pass
    first.close()
    second.close()


def test_busy_timeout_wal_and_synchronous_are_applied(tmp_path):
    normal = connect(tmp_path / "counters.sqlite3", synchronous="NORMAL")
    full = connect(tmp_path / "keys.sqlite3", synchronous="FULL")
    for db, level in ((normal, 1), (full, 2)):
        assert db.execute("PRAGMA busy_timeout").fetchone()[0] == int(BUSY_TIMEOUT_SECONDS * 1000)
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA synchronous").fetchone()[0] == level
        assert db.isolation_level is None  # autocommit: BEGIN is ours
        db.close()


def test_a_level_other_than_normal_or_full_is_refused(tmp_path):
    with pytest.raises(ValueError, match="synchronous"):
        connect(tmp_path / "x.sqlite3", synchronous="OFF")
    assert not (tmp_path / "x.sqlite3").exists()


def test_files_are_the_owners_only_whatever_the_umask(tmp_path):
    previous = os.umask(0)
    try:
        path = tmp_path / "state" / "x.sqlite3"
        db = connect(path, synchronous="NORMAL")
        db.execute("CREATE TABLE t (v INTEGER)")
        db.execute("INSERT INTO t VALUES (1)")
        assert _mode(path.parent) == 0o700
        assert all(_mode(f"{path}{suffix}") == 0o600 for suffix in ("", "-wal", "-shm"))
        db.close()
    finally:
        os.umask(previous)


def test_an_older_0644_database_and_its_wal_are_tightened(tmp_path):
    path = tmp_path / "old.sqlite3"
    old = sqlite3.connect(path)  # as an older version left it: the umask's mode
    old.execute("CREATE TABLE t (v INTEGER)")
    old.commit()
    old.close()
    (tmp_path / "old.sqlite3-wal").write_bytes(b"")
    for name in ("old.sqlite3", "old.sqlite3-wal"):
        (tmp_path / name).chmod(0o644)
    db = connect(path, synchronous="FULL")
    assert _mode(path) == 0o600 and _mode(f"{path}-wal") == 0o600
    assert db.execute("SELECT count(*) FROM t").fetchone()[0] == 0  # the old file is opened, not replaced
    db.close()


def test_memory_databases_touch_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    db = connect(":memory:", synchronous="NORMAL")
    with transaction(db):
        db.execute("CREATE TABLE t (v INTEGER)")
    db.close()
    assert list(tmp_path.iterdir()) == []
