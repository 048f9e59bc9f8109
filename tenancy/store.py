"""SQLite persistence for tenants, their API keys, daily usage and an audit log.

One connection per store, shared across threads under a lock (the gateway
serves from a thread pool and an event loop). Keys are stored as SHA-256
digests (see tenancy.keys), so checking one costs microseconds; rows from
older versions that hold only an argon2 hash are verified with argon2 once,
outside the lock, and then get their digest.

Deletions are permanent: revoking a key or deleting a tenant (which revokes
its keys) leaves a tombstone (``revoked_keys``, ``deleted_tenants``), and
``seeded_tenants`` records which tenants the tenants file has created, so a
restart never brings back what an admin removed (see tenancy.config).
The database file and its -wal/-shm files are readable by the owner only.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

from system.sqlite import connect
from tenancy.keys import (
    ApiKeyHasher,
    MalformedKey,
    generate_api_key,
    key_sha256,
    parse_api_key,
    sha256_matches,
)
from tenancy.models import (  # noqa: F401 (the errors are re-exported for callers)
    KEY_ADDED,
    KEY_NONE,
    KEY_REPLACED,
    KEY_REVOKED,
    KEY_UNCHANGED,
    SCHEMA_SQL,
    SCHEMA_VERSION,
    ApiKeyInfo,
    ApiKeyNotFound,
    AuditEntry,
    SeedResult,
    Tenant,
    TenantExists,
    TenantNotFound,
    UsageRow,
    day_string,
    limits_detail,
    models_json,
    utc_now,
    validate_tenant_name,
    validated_limits,
)
from tenancy.sqlite_db import LockedSQLite

KEY_ORIGIN_GENERATED = "generated"
KEY_ORIGIN_CONFIG = "config"
# Older versions deleted keys and tenants outright; rebuild their tombstones from the audit
# log, which names every key id ever issued. Seeding then was done with actor "config".
_BACKFILL_TOMBSTONES = (
    "INSERT OR IGNORE INTO seeded_tenants (name, seeded_at) SELECT target, MIN(ts) FROM audit "
    "WHERE actor = 'config' AND action = 'tenant.create' GROUP BY target",
    "INSERT OR IGNORE INTO deleted_tenants (name, deleted_at) SELECT target, MAX(ts) FROM audit "
    "WHERE action = 'tenant.delete' AND target NOT IN (SELECT name FROM tenants) GROUP BY target",
    "INSERT OR IGNORE INTO revoked_keys (key_id, tenant, revoked_at) "
    "SELECT json_extract(detail, '$.key_id') AS kid, target, MAX(ts) FROM audit "
    "WHERE kid IS NOT NULL AND kid NOT IN (SELECT key_id FROM api_keys) GROUP BY kid",
)


class TenantStore(LockedSQLite):
    def __init__(self, db_path: str | Path, hasher: ApiKeyHasher | None = None) -> None:
        self._hasher = hasher or ApiKeyHasher()  # only for legacy argon2 rows
        self._lock = threading.Lock()
        # Each method is one transaction (we issue BEGIN ourselves). FULL: a key that was handed out
        # or revoked must stay so after a power loss.
        self._conn = connect(db_path, synchronous="FULL")
        self._conn.row_factory = sqlite3.Row
        with self._lock:
            self._conn.execute("PRAGMA foreign_keys=ON")
            self._conn.executescript(SCHEMA_SQL)
        with self._transaction() as conn:
            self._migrate(conn)

    @staticmethod
    def _migrate(conn: sqlite3.Connection) -> None:
        if conn.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
            return
        columns = {row["name"] for row in conn.execute("PRAGMA table_info(api_keys)")}
        if "key_sha256" not in columns:
            conn.execute("ALTER TABLE api_keys ADD COLUMN key_sha256 TEXT")
        for statement in _BACKFILL_TOMBSTONES:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    @staticmethod
    def _audit(
        conn: sqlite3.Connection, actor: str, action: str, target: str, detail: dict[str, Any] | None = None
    ) -> None:
        conn.execute(
            "INSERT INTO audit (ts, actor, action, target, detail) VALUES (?, ?, ?, ?, ?)",
            (utc_now(), actor, action, target, json.dumps(detail or {}, sort_keys=True)),
        )

    @staticmethod
    def _select_tenant(conn: sqlite3.Connection, name: str) -> Tenant | None:
        row = conn.execute("SELECT * FROM tenants WHERE name = ?", (name,)).fetchone()
        return Tenant.from_row(row) if row is not None else None

    @staticmethod
    def _insert_tenant(conn: sqlite3.Connection, name: str, limits: dict[str, Any], now: str) -> Tenant:
        conn.execute(
            "INSERT INTO tenants (name, models, rpm, tpm, max_concurrency, created_at) VALUES (?, ?, ?, ?, ?, ?)",
            (name, models_json(limits["models"]), limits["rpm"], limits["tpm"], limits["max_concurrency"], now),
        )
        conn.execute("DELETE FROM deleted_tenants WHERE name = ?", (name,))
        return Tenant(name=name, created_at=now, **limits)

    @staticmethod
    def _insert_key(conn: sqlite3.Connection, tenant: str, api_key: str, origin: str) -> str:
        key_id = parse_api_key(api_key).key_id
        if conn.execute("SELECT 1 FROM revoked_keys WHERE key_id = ?", (key_id,)).fetchone():
            raise ValueError(f"API key id {key_id} was revoked and cannot be used again")
        # key_hash '' explicitly: older databases declare it NOT NULL without a default.
        conn.execute(
            "INSERT INTO api_keys (key_id, tenant, key_hash, key_sha256, origin, created_at) "
            "VALUES (?, ?, '', ?, ?, ?)",
            (key_id, tenant, key_sha256(api_key), origin, utc_now()),
        )
        return key_id

    @staticmethod
    def _revoke_keys(conn: sqlite3.Connection, where: str, params: Sequence[Any]) -> list[str]:
        """Delete the matching api_keys rows, leaving a tombstone per key id."""
        rows = conn.execute(f"SELECT key_id, tenant FROM api_keys WHERE {where}", params).fetchall()
        now = utc_now()
        conn.executemany(
            "INSERT OR REPLACE INTO revoked_keys (key_id, tenant, revoked_at) VALUES (?, ?, ?)",
            [(r["key_id"], r["tenant"], now) for r in rows],
        )
        conn.execute(f"DELETE FROM api_keys WHERE {where}", params)
        return [r["key_id"] for r in rows]

    # ---- tenants -------------------------------------------------------------

    def create_tenant(
        self,
        name: str,
        models: Sequence[str] | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
        max_concurrency: int | None = None,
        actor: str = "admin",
    ) -> tuple[Tenant, str]:
        """Create a tenant and its first key; the returned key is never retrievable again."""
        validate_tenant_name(name)
        limits = validated_limits(models, rpm, tpm, max_concurrency)
        api_key = generate_api_key()
        with self._transaction() as conn:
            if self._select_tenant(conn, name) is not None:
                raise TenantExists(name)
            tenant = self._insert_tenant(conn, name, limits, utc_now())
            key_id = self._insert_key(conn, name, api_key, KEY_ORIGIN_GENERATED)
            self._audit(conn, actor, "tenant.create", name, {**limits_detail(limits), "key_id": key_id})
        return tenant, api_key

    def update_tenant(
        self,
        name: str,
        models: Sequence[str] | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
        max_concurrency: int | None = None,
        actor: str = "admin",
    ) -> Tenant:
        """Replace all of a tenant's limits (None = unlimited / every model)."""
        limits = validated_limits(models, rpm, tpm, max_concurrency)
        with self._transaction() as conn:
            current = self._select_tenant(conn, name)
            if current is None:
                raise TenantNotFound(name)
            return self._update_limits(conn, current, limits, actor)

    def _update_limits(self, conn: sqlite3.Connection, current: Tenant, limits: dict[str, Any], actor: str) -> Tenant:
        updated = Tenant(name=current.name, created_at=current.created_at, **limits)
        if updated == current:
            return current
        conn.execute(
            "UPDATE tenants SET models = ?, rpm = ?, tpm = ?, max_concurrency = ? WHERE name = ?",
            (models_json(updated.models), updated.rpm, updated.tpm, updated.max_concurrency, current.name),
        )
        self._audit(conn, actor, "tenant.update", current.name, limits_detail(limits))
        return updated

    def seed_tenant(
        self,
        name: str,
        api_key: str | None = None,
        models: Sequence[str] | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
        max_concurrency: int | None = None,
        actor: str = "config",
        reseed: bool = False,
    ) -> SeedResult:
        """Apply one tenant of the tenants file, once; ``api_key`` comes from the environment.

        The first time (or with ``reseed``) the tenant is created, or its limits are set to
        these, and it is recorded as seeded. After that only the key is synced: its limits are
        left to the admin API, and a deleted tenant stays deleted. A tenant created here
        without ``api_key`` gets a generated key (``new_key``, shown once). The key: a revoked
        key id is never added back (``KEY_REVOKED``); a new key id revokes the tenant's
        earlier config keys (admin-created keys stay); a new secret for a stored key id
        replaces its digest. Raises ValueError for a malformed key or one owned by another
        tenant; the message never contains the key.
        """
        validate_tenant_name(name)
        limits = validated_limits(models, rpm, tpm, max_concurrency)
        key_id = parse_api_key(api_key).key_id if api_key else None  # MalformedKey: ValueError
        # A legacy argon2 row is verified here, outside the lock (milliseconds).
        legacy = (
            self._read("SELECT tenant, key_hash FROM api_keys WHERE key_id = ? AND key_sha256 IS NULL", (key_id,))
            if key_id
            else []
        )
        verified_hash = (
            legacy[0]["key_hash"]
            if legacy and legacy[0]["tenant"] == name and self._hasher.verify(legacy[0]["key_hash"], api_key or "")
            else None
        )
        with self._transaction() as conn:
            key_row = conn.execute("SELECT * FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
            if key_row is not None and key_row["tenant"] != name:
                raise ValueError(f"API key id {key_id} already belongs to another tenant")
            tenant = self._select_tenant(conn, name)
            seeded = conn.execute("SELECT 1 FROM seeded_tenants WHERE name = ?", (name,)).fetchone()
            if seeded and not reseed:
                if tenant is None:
                    deleted = conn.execute("SELECT deleted_at FROM deleted_tenants WHERE name = ?", (name,)).fetchone()
                    return SeedResult(
                        None,
                        seeded=False,
                        created=False,
                        key_id=key_id,
                        deleted_at=deleted["deleted_at"] if deleted else "unknown",
                    )
                created = False
            else:
                created = tenant is None
                if created:
                    tenant = self._insert_tenant(conn, name, limits, utc_now())
                    self._audit(conn, actor, "tenant.create", name, limits_detail(limits))
                else:
                    tenant = self._update_limits(conn, tenant, limits, actor)
                conn.execute("INSERT OR REPLACE INTO seeded_tenants (name, seeded_at) VALUES (?, ?)", (name, utc_now()))
            new_key = None
            if created and api_key is None:
                new_key = generate_api_key()
                self._audit(
                    conn,
                    actor,
                    "key.create",
                    name,
                    {"key_id": self._insert_key(conn, name, new_key, KEY_ORIGIN_GENERATED)},
                )
            status = self._sync_config_key(conn, name, api_key, key_row, verified_hash, actor) if api_key else KEY_NONE
        return SeedResult(
            tenant, seeded=not seeded or reseed, created=created, key_status=status, key_id=key_id, new_key=new_key
        )

    def _sync_config_key(
        self,
        conn: sqlite3.Connection,
        name: str,
        api_key: str,
        key_row: sqlite3.Row | None,
        verified_hash: str | None,
        actor: str,
    ) -> str:
        key_id = parse_api_key(api_key).key_id
        if conn.execute("SELECT 1 FROM revoked_keys WHERE key_id = ?", (key_id,)).fetchone():
            return KEY_REVOKED
        digest = key_sha256(api_key)
        if key_row is None:
            replaced = self._revoke_keys(conn, "tenant = ? AND origin = ?", (name, KEY_ORIGIN_CONFIG))
            self._insert_key(conn, name, api_key, KEY_ORIGIN_CONFIG)
            self._audit(conn, actor, "key.set", name, {"key_id": key_id, "revoked_keys": replaced})
            return KEY_ADDED
        if key_row["key_sha256"] is not None and sha256_matches(key_row["key_sha256"], api_key):
            return KEY_UNCHANGED
        if key_row["key_sha256"] is None and verified_hash == key_row["key_hash"]:
            conn.execute("UPDATE api_keys SET key_sha256 = ? WHERE key_id = ?", (digest, key_id))
            return KEY_UNCHANGED
        conn.execute(
            "UPDATE api_keys SET key_sha256 = ?, key_hash = '', origin = ? WHERE key_id = ?",
            (digest, KEY_ORIGIN_CONFIG, key_id),
        )
        self._audit(conn, actor, "key.set", name, {"key_id": key_id, "replaced_secret": True})
        return KEY_REPLACED

    def list_tenants(self) -> list[Tenant]:
        return [Tenant.from_row(r) for r in self._read("SELECT * FROM tenants ORDER BY name")]

    def get_tenant(self, name: str) -> Tenant | None:
        rows = self._read("SELECT * FROM tenants WHERE name = ?", (name,))
        return Tenant.from_row(rows[0]) if rows else None

    def delete_tenant(self, name: str, actor: str = "admin") -> None:
        """Delete the tenant and revoke all its keys; its usage rows stay for accounting.

        Permanent: the tenants file does not re-create it unless re-seeded, and its
        key ids can never be used again.
        """
        with self._transaction() as conn:
            if self._select_tenant(conn, name) is None:
                raise TenantNotFound(name)
            removed_keys = self._revoke_keys(conn, "tenant = ?", (name,))
            conn.execute("DELETE FROM tenants WHERE name = ?", (name,))
            conn.execute("INSERT OR REPLACE INTO deleted_tenants (name, deleted_at) VALUES (?, ?)", (name, utc_now()))
            self._audit(conn, actor, "tenant.delete", name, {"removed_keys": len(removed_keys)})

    # ---- keys ----------------------------------------------------------------

    def create_api_key(self, tenant: str, actor: str = "admin") -> str:
        """Add another key to an existing tenant (e.g. for rotation); shown once."""
        api_key = generate_api_key()
        with self._transaction() as conn:
            if self._select_tenant(conn, tenant) is None:
                raise TenantNotFound(tenant)
            key_id = self._insert_key(conn, tenant, api_key, KEY_ORIGIN_GENERATED)
            self._audit(conn, actor, "key.create", tenant, {"key_id": key_id})
        return api_key

    def revoke_api_key(self, tenant: str, key_id: str, actor: str = "admin") -> None:
        """Revoke a key for good: the key id is never accepted or re-added again."""
        with self._transaction() as conn:
            if not self._revoke_keys(conn, "tenant = ? AND key_id = ?", (tenant, key_id)):
                raise ApiKeyNotFound(key_id)
            self._audit(conn, actor, "key.revoke", tenant, {"key_id": key_id})

    def list_api_keys(self, tenant: str) -> list[ApiKeyInfo]:
        rows = self._read(
            "SELECT key_id, tenant, origin, created_at FROM api_keys WHERE tenant = ? ORDER BY created_at, key_id",
            (tenant,),
        )
        return [
            ApiKeyInfo(key_id=r["key_id"], tenant=r["tenant"], origin=r["origin"], created_at=r["created_at"])
            for r in rows
        ]

    def is_key_revoked(self, key_id: str) -> bool:
        return bool(self._read("SELECT 1 FROM revoked_keys WHERE key_id = ?", (key_id,)))

    def authenticate(self, api_key: str | None, allow_hashing: bool = True) -> Tenant | None:
        """The tenant owning ``api_key``, or None. Never raises on bad input.

        One indexed lookup by key_id and a SHA-256 comparison: microseconds, right or
        wrong. Only a legacy row (argon2 hash, no digest yet) costs argon2, and only when
        ``allow_hashing``; once it verifies, the row gets its digest.
        """
        if not api_key:
            return None
        try:
            key_id = parse_api_key(api_key).key_id
        except MalformedKey:
            return None
        rows = self._read(
            "SELECT t.*, k.key_hash, k.key_sha256 FROM api_keys k "
            "JOIN tenants t ON t.name = k.tenant WHERE k.key_id = ?",
            (key_id,),
        )
        if not rows:
            return None
        row = rows[0]
        if row["key_sha256"] is not None:
            return Tenant.from_row(row) if sha256_matches(row["key_sha256"], api_key) else None
        if not allow_hashing or not self._hasher.verify(row["key_hash"], api_key):
            return None
        with self._transaction() as conn:  # compare-and-set: the row may have changed meanwhile
            conn.execute(
                "UPDATE api_keys SET key_sha256 = ? WHERE key_id = ? AND key_hash = ? AND key_sha256 IS NULL",
                (key_sha256(api_key), key_id, row["key_hash"]),
            )
        return Tenant.from_row(row)

    # ---- usage and audit -----------------------------------------------------

    def record_usage(
        self,
        tenant: str,
        model: str,
        prompt_tokens: int,
        completion_tokens: int,
        day: date | str | None = None,
        requests: int = 1,
    ) -> None:
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
                (tenant, model, day_string(day), requests, prompt_tokens, completion_tokens),
            )

    def usage(self, tenant: str | None = None) -> list[UsageRow]:
        """Usage rows, newest day first; every tenant's when ``tenant`` is None."""
        sql = "SELECT * FROM usage"
        params: tuple[Any, ...] = ()
        if tenant is not None:
            sql += " WHERE tenant = ?"
            params = (tenant,)
        rows = self._read(sql + " ORDER BY day DESC, tenant, model", params)
        return [
            UsageRow(
                tenant=r["tenant"],
                model=r["model"],
                day=r["day"],
                requests=r["requests"],
                prompt_tokens=r["prompt_tokens"],
                completion_tokens=r["completion_tokens"],
            )
            for r in rows
        ]

    def audit_log(self, limit: int = 100) -> list[AuditEntry]:
        """The most recent audit entries, newest first."""
        rows = self._read("SELECT * FROM audit ORDER BY id DESC LIMIT ?", (max(0, int(limit)),))
        return [
            AuditEntry(
                id=r["id"],
                ts=r["ts"],
                actor=r["actor"],
                action=r["action"],
                target=r["target"],
                detail=json.loads(r["detail"]),
            )
            for r in rows
        ]
