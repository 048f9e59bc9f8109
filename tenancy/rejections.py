"""429s per tenant and UTC day: what the dashboard and GET /admin/tenants/{name}/usage show as "refused
today". Prometheus counts rejections too, but per process and since its start; this survives restarts
and is the same for every gateway replica (one SQLite file beside the tenant store)."""

from __future__ import annotations

import threading
from datetime import date
from pathlib import Path

from system.sqlite import connect
from tenancy.models import day_string
from tenancy.sqlite_db import LockedSQLite

SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS rejections (
    tenant TEXT NOT NULL,
    day TEXT NOT NULL,
    reason TEXT NOT NULL,  -- rpm, tpm or concurrency
    count INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, day, reason)
);
"""


class RejectionLog(LockedSQLite):
    def __init__(self, db_path: str | Path) -> None:
        self._lock = threading.Lock()
        # A tally for the dashboard, written on every 429: a power loss may forget the last few.
        self._conn = connect(db_path, synchronous="NORMAL")
        with self._lock:
            self._conn.executescript(SCHEMA_SQL)

    def record(self, tenant: str, reason: str, day: date | str | None = None) -> None:
        with self._transaction() as conn:
            conn.execute(
                "INSERT INTO rejections (tenant, day, reason, count) VALUES (?, ?, ?, 1) "
                "ON CONFLICT (tenant, day, reason) DO UPDATE SET count = count + 1",
                (tenant, day_string(day), reason),
            )

    def counts(self, tenant: str | None = None, day: date | str | None = None) -> dict[str, dict[str, int]]:
        """{tenant: {reason: count}} for one UTC day (today by default); every tenant's when tenant is None."""
        sql, params = "SELECT tenant, reason, count FROM rejections WHERE day = ?", [day_string(day)]
        if tenant is not None:
            sql, params = sql + " AND tenant = ?", [*params, tenant]
        found: dict[str, dict[str, int]] = {}
        with self._lock:
            for name, reason, count in self._conn.execute(sql, params).fetchall():
                found.setdefault(name, {})[reason] = count
        return found
