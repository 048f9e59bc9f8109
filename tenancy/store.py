"""SQLite persistence for tenants, their API keys, daily usage and an audit log.

One connection per store, shared across threads under a lock (the gateway
serves from a thread pool and an event loop). Argon2 hashing and verification
run outside that lock so one slow key check never blocks other requests.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any

from tenancy.keys import (
    ApiKeyHasher,
    MalformedKey,
    VerifiedKeyCache,
    generate_api_key,
    parse_api_key,
)
from tenancy.models import (
    ApiKeyInfo,
    AuditEntry,
    Tenant,
    UsageRow,
    normalize_models,
    validate_limit,
    validate_tenant_name,
)

KEY_ORIGIN_GENERATED = "generated"
KEY_ORIGIN_CONFIG = "config"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tenants (
    name TEXT PRIMARY KEY,
    models TEXT,                -- JSON list; NULL means every model
    rpm INTEGER,                -- NULL means unlimited (same for tpm, max_concurrency)
    tpm INTEGER,
    max_concurrency INTEGER,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS api_keys (
    key_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL REFERENCES tenants(name) ON DELETE CASCADE,
    key_hash TEXT NOT NULL,
    origin TEXT NOT NULL DEFAULT 'generated',
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS api_keys_by_tenant ON api_keys(tenant);
-- No foreign key: usage and audit outlive a deleted tenant for accounting.
CREATE TABLE IF NOT EXISTS usage (
    tenant TEXT NOT NULL,
    model TEXT NOT NULL,
    day TEXT NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0,
    prompt_tokens INTEGER NOT NULL DEFAULT 0,
    completion_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant, model, day)
);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts TEXT NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    detail TEXT NOT NULL
);
"""


class TenantExists(Exception):
    """Creating a tenant whose name is taken (maps to HTTP 409)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"tenant {name!r} already exists")
        self.name = name


class TenantNotFound(Exception):
    """The named tenant does not exist (maps to HTTP 404)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"tenant {name!r} does not exist")
        self.name = name


class ApiKeyNotFound(Exception):
    """The key id does not exist for that tenant (maps to HTTP 404)."""

    def __init__(self, key_id: str) -> None:
        super().__init__(f"API key {key_id!r} does not exist")
        self.key_id = key_id


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _day_string(day: date | str | None) -> str:
    if day is None:
        return datetime.now(timezone.utc).date().isoformat()
    if isinstance(day, date):
        return day.isoformat()
    return date.fromisoformat(day).isoformat()  # validates the format


def _tenant_from_row(row: sqlite3.Row) -> Tenant:
    models = json.loads(row["models"]) if row["models"] is not None else None
    return Tenant(name=row["name"], models=tuple(models) if models is not None else None,
                  rpm=row["rpm"], tpm=row["tpm"], max_concurrency=row["max_concurrency"],
                  created_at=row["created_at"])


def _validated_limits(models: Sequence[str] | None, rpm: int | None, tpm: int | None,
                      max_concurrency: int | None) -> dict[str, Any]:
    return {
        "models": normalize_models(models),
        "rpm": validate_limit("rpm", rpm),
        "tpm": validate_limit("tpm", tpm),
        "max_concurrency": validate_limit("max_concurrency", max_concurrency),
    }


def _models_json(models: tuple[str, ...] | None) -> str | None:
    return json.dumps(list(models)) if models is not None else None


class TenantStore:
    def __init__(self, db_path: str | Path, hasher: ApiKeyHasher | None = None,
                 key_cache_size: int = 1024) -> None:
        self._hasher = hasher or ApiKeyHasher()
        self._verified_keys = VerifiedKeyCache(key_cache_size)
        self._lock = threading.Lock()
        if str(db_path) != ":memory:":
            Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we issue BEGIN ourselves, so each method is one transaction.
        self._conn = sqlite3.connect(str(db_path), check_same_thread=False, isolation_level=None,
                                     timeout=10.0)
        self._conn.row_factory = sqlite3.Row
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA foreign_keys=ON")
            self._conn.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> TenantStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            # IMMEDIATE takes the write lock up front, so two gateway processes
            # sharing the file cannot interleave a read-then-write.
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    @staticmethod
    def _audit(conn: sqlite3.Connection, actor: str, action: str, target: str,
               detail: dict[str, Any] | None = None) -> None:
        conn.execute("INSERT INTO audit (ts, actor, action, target, detail) VALUES (?, ?, ?, ?, ?)",
                     (_utc_now(), actor, action, target, json.dumps(detail or {}, sort_keys=True)))

    @staticmethod
    def _select_tenant(conn: sqlite3.Connection, name: str) -> Tenant | None:
        row = conn.execute("SELECT * FROM tenants WHERE name = ?", (name,)).fetchone()
        return _tenant_from_row(row) if row is not None else None

    # ---- tenants -------------------------------------------------------------

    def create_tenant(self, name: str, models: Sequence[str] | None = None,
                      rpm: int | None = None, tpm: int | None = None,
                      max_concurrency: int | None = None,
                      actor: str = "admin") -> tuple[Tenant, str]:
        """Create a tenant and its first key; the returned key is never retrievable again."""
        validate_tenant_name(name)
        limits = _validated_limits(models, rpm, tpm, max_concurrency)
        api_key = generate_api_key()
        key_hash = self._hasher.hash(api_key)  # slow: outside the lock
        created_at = _utc_now()
        with self._transaction() as conn:
            if self._select_tenant(conn, name) is not None:
                raise TenantExists(name)
            conn.execute(
                "INSERT INTO tenants (name, models, rpm, tpm, max_concurrency, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (name, _models_json(limits["models"]), limits["rpm"], limits["tpm"],
                 limits["max_concurrency"], created_at))
            key_id = parse_api_key(api_key).key_id
            conn.execute("INSERT INTO api_keys (key_id, tenant, key_hash, origin, created_at) "
                         "VALUES (?, ?, ?, ?, ?)",
                         (key_id, name, key_hash, KEY_ORIGIN_GENERATED, created_at))
            self._audit(conn, actor, "tenant.create", name,
                        {**_limits_detail(limits), "key_id": key_id})
        return Tenant(name=name, created_at=created_at, **limits), api_key

    def update_tenant(self, name: str, models: Sequence[str] | None = None,
                      rpm: int | None = None, tpm: int | None = None,
                      max_concurrency: int | None = None, actor: str = "admin") -> Tenant:
        """Replace all of a tenant's limits (None = unlimited / every model)."""
        limits = _validated_limits(models, rpm, tpm, max_concurrency)
        with self._transaction() as conn:
            current = self._select_tenant(conn, name)
            if current is None:
                raise TenantNotFound(name)
            return self._update_limits(conn, current, limits, actor)

    def _update_limits(self, conn: sqlite3.Connection, current: Tenant,
                       limits: dict[str, Any], actor: str) -> Tenant:
        updated = Tenant(name=current.name, created_at=current.created_at, **limits)
        if updated == current:
            return current
        conn.execute("UPDATE tenants SET models = ?, rpm = ?, tpm = ?, max_concurrency = ? "
                     "WHERE name = ?",
                     (_models_json(updated.models), updated.rpm, updated.tpm,
                      updated.max_concurrency, current.name))
        self._audit(conn, actor, "tenant.update", current.name, _limits_detail(limits))
        return updated

    def ensure_tenant_with_key(self, name: str, api_key: str,
                               models: Sequence[str] | None = None, rpm: int | None = None,
                               tpm: int | None = None, max_concurrency: int | None = None,
                               actor: str = "config") -> Tenant:
        """Make the tenant exist with exactly these limits and accept ``api_key``.

        For tenants declared in the tenants file with a key from the environment.
        Idempotent: a restart with the same key and limits writes nothing. If the
        key changed, earlier config-provided keys of the tenant are replaced;
        keys created through the admin API are kept.
        """
        validate_tenant_name(name)
        limits = _validated_limits(models, rpm, tpm, max_concurrency)
        key_id = parse_api_key(api_key).key_id  # MalformedKey is a ValueError
        rows = self._read("SELECT tenant, key_hash FROM api_keys WHERE key_id = ?", (key_id,))
        if rows and rows[0]["tenant"] != name:
            raise ValueError(f"API key id {key_id} already belongs to another tenant")
        key_is_current = bool(rows) and self._hasher.verify(rows[0]["key_hash"], api_key)
        new_key_hash = None if key_is_current else self._hasher.hash(api_key)
        now = _utc_now()
        with self._transaction() as conn:
            tenant = self._select_tenant(conn, name)
            if tenant is None:
                conn.execute(
                    "INSERT INTO tenants (name, models, rpm, tpm, max_concurrency, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (name, _models_json(limits["models"]), limits["rpm"], limits["tpm"],
                     limits["max_concurrency"], now))
                self._audit(conn, actor, "tenant.create", name, _limits_detail(limits))
                tenant = Tenant(name=name, created_at=now, **limits)
            else:
                tenant = self._update_limits(conn, tenant, limits, actor)
            if new_key_hash is not None:
                replaced = conn.execute(
                    "DELETE FROM api_keys WHERE tenant = ? AND origin = ? AND key_id != ?",
                    (name, KEY_ORIGIN_CONFIG, key_id)).rowcount
                conn.execute(
                    "INSERT OR REPLACE INTO api_keys (key_id, tenant, key_hash, origin, created_at) "
                    "VALUES (?, ?, ?, ?, ?)", (key_id, name, new_key_hash, KEY_ORIGIN_CONFIG, now))
                self._audit(conn, actor, "key.set", name,
                            {"key_id": key_id, "replaced_keys": replaced + len(rows)})
        return tenant

    def list_tenants(self) -> list[Tenant]:
        return [_tenant_from_row(r) for r in self._read("SELECT * FROM tenants ORDER BY name")]

    def get_tenant(self, name: str) -> Tenant | None:
        rows = self._read("SELECT * FROM tenants WHERE name = ?", (name,))
        return _tenant_from_row(rows[0]) if rows else None

    def delete_tenant(self, name: str, actor: str = "admin") -> None:
        """Delete the tenant and all its keys; its usage rows stay for accounting."""
        with self._transaction() as conn:
            if self._select_tenant(conn, name) is None:
                raise TenantNotFound(name)
            removed_keys = conn.execute("DELETE FROM api_keys WHERE tenant = ?", (name,)).rowcount
            conn.execute("DELETE FROM tenants WHERE name = ?", (name,))
            self._audit(conn, actor, "tenant.delete", name, {"removed_keys": removed_keys})

    # ---- keys ----------------------------------------------------------------

    def create_api_key(self, tenant: str, actor: str = "admin") -> str:
        """Add another key to an existing tenant (e.g. for rotation); shown once."""
        api_key = generate_api_key()
        key_hash = self._hasher.hash(api_key)
        key_id = parse_api_key(api_key).key_id
        with self._transaction() as conn:
            if self._select_tenant(conn, tenant) is None:
                raise TenantNotFound(tenant)
            conn.execute("INSERT INTO api_keys (key_id, tenant, key_hash, origin, created_at) "
                         "VALUES (?, ?, ?, ?, ?)",
                         (key_id, tenant, key_hash, KEY_ORIGIN_GENERATED, _utc_now()))
            self._audit(conn, actor, "key.create", tenant, {"key_id": key_id})
        return api_key

    def revoke_api_key(self, tenant: str, key_id: str, actor: str = "admin") -> None:
        with self._transaction() as conn:
            deleted = conn.execute("DELETE FROM api_keys WHERE tenant = ? AND key_id = ?",
                                   (tenant, key_id)).rowcount
            if not deleted:
                raise ApiKeyNotFound(key_id)
            self._audit(conn, actor, "key.revoke", tenant, {"key_id": key_id})

    def list_api_keys(self, tenant: str) -> list[ApiKeyInfo]:
        rows = self._read("SELECT key_id, tenant, origin, created_at FROM api_keys "
                          "WHERE tenant = ? ORDER BY created_at, key_id", (tenant,))
        return [ApiKeyInfo(key_id=r["key_id"], tenant=r["tenant"], origin=r["origin"],
                           created_at=r["created_at"]) for r in rows]

    def authenticate(self, api_key: str | None, allow_hashing: bool = True) -> Tenant | None:
        """The tenant owning ``api_key``, or None. Never raises on bad input.

        One indexed lookup by key_id, then argon2 verification unless this
        process already verified the same key against the same stored hash.
        With ``allow_hashing`` False only an already-verified key passes (the
        caller's defence against floods of wrong keys for one key id).
        """
        if not api_key:
            return None
        try:
            key_id = parse_api_key(api_key).key_id
        except MalformedKey:
            return None
        rows = self._read("SELECT t.*, k.key_hash FROM api_keys k "
                          "JOIN tenants t ON t.name = k.tenant WHERE k.key_id = ?", (key_id,))
        if not rows:
            return None
        key_hash = rows[0]["key_hash"]
        if not self._verified_keys.is_verified(api_key, key_hash):
            if not allow_hashing or not self._hasher.verify(key_hash, api_key):
                return None
            self._verified_keys.remember(api_key, key_hash)
        return _tenant_from_row(rows[0])

    # ---- usage and audit -----------------------------------------------------

    def record_usage(self, tenant: str, model: str, prompt_tokens: int, completion_tokens: int,
                     day: date | str | None = None, requests: int = 1) -> None:
        """Add one request's (or ``requests``') tokens to the tenant/model/day row."""
        if min(prompt_tokens, completion_tokens, requests) < 0:
            raise ValueError("usage counts must not be negative")
        with self._transaction() as conn:
            conn.execute(
                "INSERT INTO usage (tenant, model, day, requests, prompt_tokens, completion_tokens) "
                "VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (tenant, model, day) DO UPDATE SET "
                "requests = requests + excluded.requests, "
                "prompt_tokens = prompt_tokens + excluded.prompt_tokens, "
                "completion_tokens = completion_tokens + excluded.completion_tokens",
                (tenant, model, _day_string(day), requests, prompt_tokens, completion_tokens))

    def usage(self, tenant: str | None = None) -> list[UsageRow]:
        """Usage rows, newest day first; every tenant's when ``tenant`` is None."""
        sql = "SELECT * FROM usage"
        params: tuple[Any, ...] = ()
        if tenant is not None:
            sql += " WHERE tenant = ?"
            params = (tenant,)
        rows = self._read(sql + " ORDER BY day DESC, tenant, model", params)
        return [UsageRow(tenant=r["tenant"], model=r["model"], day=r["day"],
                         requests=r["requests"], prompt_tokens=r["prompt_tokens"],
                         completion_tokens=r["completion_tokens"]) for r in rows]

    def audit_log(self, limit: int = 100) -> list[AuditEntry]:
        """The most recent audit entries, newest first."""
        rows = self._read("SELECT * FROM audit ORDER BY id DESC LIMIT ?", (max(0, int(limit)),))
        return [AuditEntry(id=r["id"], ts=r["ts"], actor=r["actor"], action=r["action"],
                           target=r["target"], detail=json.loads(r["detail"])) for r in rows]


def _limits_detail(limits: dict[str, Any]) -> dict[str, Any]:
    models = limits["models"]
    return {**limits, "models": list(models) if models is not None else None}
