"""One SQLite connection shared by a process's threads, with write transactions that are atomic
across processes (the gateway replicas share the files)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from system.sqlite import transaction


class LockedSQLite:
    """Subclasses set `self._conn` (from system.sqlite.connect) and `self._lock`."""

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
        # The lock keeps this process's threads out of each other's transaction on the one connection;
        # BEGIN IMMEDIATE keeps the other processes out.
        with self._lock, transaction(self._conn) as conn:
            yield conn
