"""How poolserve opens its SQLite databases and runs a write transaction.

Every database is shared by processes on one host (gateway replicas share the tenant files; the
retriever's knowledge store is also read by `poolserve stress`), so each connection:

- waits up to BUSY_TIMEOUT_SECONDS for another process's lock instead of failing at once;
- uses WAL, so readers never block the one writer;
- is autocommit (isolation_level=None) and shareable between threads (check_same_thread=False):
  callers hold their own lock and open transactions themselves with `transaction`;
- lives in a file only its owner can read (system/private_files.py). SQLite gives the -wal and -shm
  files the database file's mode; ones an older version left looser are tightened.

`synchronous` is the caller's choice, by what a power loss (or an OS crash) may cost. Under WAL both
levels keep the file consistent after any crash, and a process crash loses nothing either way:
- "FULL" syncs the WAL on every COMMIT: a transaction that was acknowledged survives power loss.
  For what a client was told is stored: the knowledge store's documents, the tenant store's
  tenants, keys, revocations and usage.
- "NORMAL" syncs only at checkpoints: the last transactions before a power loss may roll back.
  For what is cheap to lose and written on every request: rate-limit counters and leases,
  the rejections tally.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from system.private_files import make_private_dir, tighten_private, touch_private

# One wait for the whole project. Ordinary write transactions hold the lock for milliseconds; the
# longest holders are a start-up migration (filling an old knowledge store's lexical and metadata
# indexes) and a large ingest batch, which take seconds. 10 s outlasts those, so a replica starting
# beside them waits instead of failing with "database is locked", and is still short enough that a
# writer that is truly stuck surfaces as an error rather than a hung request.
BUSY_TIMEOUT_SECONDS = 10.0

Synchronous = Literal["NORMAL", "FULL"]
_SYNCHRONOUS_LEVELS = ("NORMAL", "FULL")
_NOT_A_FILE = ("", ":memory:")


def connect(path: str | Path, *, synchronous: Synchronous) -> sqlite3.Connection:
    """Open (creating it owner-only if missing) the database at `path`, in WAL mode."""
    if synchronous not in _SYNCHRONOUS_LEVELS:
        raise ValueError(f"synchronous must be one of {_SYNCHRONOUS_LEVELS}, not {synchronous!r}")
    is_file = str(path) not in _NOT_A_FILE
    if is_file:
        make_private_dir(Path(path).parent)
        touch_private(path)  # before SQLite creates it with the umask's mode
        _tighten_sidecars(path)
    conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
    except BaseException:
        conn.close()
        raise
    if is_file:
        _tighten_sidecars(path)  # made just now by WAL: belt and braces
    return conn


@contextmanager
def transaction(conn: sqlite3.Connection, immediate: bool = True) -> Iterator[sqlite3.Connection]:
    """One transaction on an autocommit connection: COMMIT when the block ends, ROLLBACK if it raises.

    immediate: take the write lock at BEGIN, before the first read, so a read-then-write (test a
    limit, then record it) cannot interleave with another process's, and a busy database is waited
    for at BEGIN (within the busy timeout) rather than failing halfway through.
    """
    conn.execute("BEGIN IMMEDIATE" if immediate else "BEGIN")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # a failed COMMIT can leave it open; SQLite may have rolled back already
            conn.execute("ROLLBACK")
        raise


def _tighten_sidecars(path: str | Path) -> None:
    for suffix in ("-wal", "-shm"):
        tighten_private(f"{path}{suffix}")
