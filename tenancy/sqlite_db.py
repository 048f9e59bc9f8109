"""One SQLite connection shared by a process's threads, with write transactions that are atomic
across processes (the gateway replicas share the files)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class LockedSQLite:
    """Subclasses set `self._conn` (check_same_thread=False, isolation_level=None) and `self._lock`."""

    _conn: sqlite3.Connection
    _lock: threading.Lock

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            # IMMEDIATE takes the write lock before the first read, so a read-then-write (test a limit,
            # then record it) cannot interleave with another process sharing the file.
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
