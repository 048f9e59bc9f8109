"""Plain value types, errors and validators shared by the store, the limiter and the gateway."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timezone
from typing import Any

TENANT_NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")  # fullmatch: `$` would let "name\n" through


# The tenant store's tables (created by tenancy.store; kept here next to the types that mirror
# them). SCHEMA_VERSION is PRAGMA user_version: 0 is the schema before tombstones and SHA-256.
SCHEMA_VERSION = 1
SCHEMA_SQL = """
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
    key_hash TEXT NOT NULL DEFAULT '',  -- legacy argon2 hash; '' for keys made since
    origin TEXT NOT NULL DEFAULT 'generated',
    created_at TEXT NOT NULL,
    key_sha256 TEXT             -- hex SHA-256 of the whole key; NULL only on legacy rows
);
CREATE INDEX IF NOT EXISTS api_keys_by_tenant ON api_keys(tenant);
-- Tombstones. No foreign keys: they outlive the tenant.
CREATE TABLE IF NOT EXISTS revoked_keys (
    key_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    revoked_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS deleted_tenants (
    name TEXT PRIMARY KEY,
    deleted_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS seeded_tenants (
    name TEXT PRIMARY KEY,      -- created (or adopted) from the tenants file, maybe deleted since
    seeded_at TEXT NOT NULL
);
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


def validate_tenant_name(name: object) -> str:
    """Return ``name`` unchanged or raise ValueError saying what is wrong with it."""
    if not isinstance(name, str):
        raise ValueError(f"tenant name must be a string, got {type(name).__name__}")
    if not name:
        raise ValueError("tenant name must not be empty")
    if len(name) > 63:
        raise ValueError(f"tenant name is {len(name)} characters long; the maximum is 63")
    if not TENANT_NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"tenant name {name!r} is invalid: use lowercase letters, digits, '-' and '_', "
            "starting with a letter or digit"
        )
    return name


def validate_limit(field: str, value: object) -> int | None:
    """A limit is a positive int, or None meaning unlimited."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field} must be a positive integer or None (unlimited), got {value!r}")
    return value


def normalize_models(models: object) -> tuple[str, ...] | None:
    """None means every model; otherwise a de-duplicated tuple of model ids."""
    if models is None:
        return None
    if isinstance(models, str) or not all(isinstance(m, str) and m for m in models):
        raise ValueError("models must be a list of non-empty model ids, or None for every model")
    return tuple(dict.fromkeys(models))


def validated_limits(
    models: Sequence[str] | None, rpm: int | None, tpm: int | None, max_concurrency: int | None
) -> dict[str, Any]:
    """The four limit fields, validated; keys match Tenant's fields."""
    return {
        "models": normalize_models(models),
        "rpm": validate_limit("rpm", rpm),
        "tpm": validate_limit("tpm", tpm),
        "max_concurrency": validate_limit("max_concurrency", max_concurrency),
    }


def limits_detail(limits: Mapping[str, Any]) -> dict[str, Any]:
    """JSON-ready copy of ``validated_limits`` output, for audit entries."""
    models = limits["models"]
    return {**limits, "models": list(models) if models is not None else None}


def models_json(models: tuple[str, ...] | None) -> str | None:
    return json.dumps(list(models)) if models is not None else None


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def day_string(day: date | str | None) -> str:
    if day is None:
        return datetime.now(timezone.utc).date().isoformat()
    if isinstance(day, date):
        return day.isoformat()
    return date.fromisoformat(day).isoformat()  # validates the format


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


@dataclass(frozen=True)
class Tenant:
    name: str
    models: tuple[str, ...] | None = None  # None: every served model
    rpm: int | None = None  # requests per minute; None: unlimited
    tpm: int | None = None  # tokens per minute; None: unlimited
    max_concurrency: int | None = None  # in-flight requests; None: unlimited
    created_at: str = ""

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Tenant:
        """From a ``tenants`` table row (models stored as JSON text or NULL)."""
        models = json.loads(row["models"]) if row["models"] is not None else None
        return cls(
            name=row["name"],
            models=tuple(models) if models is not None else None,
            rpm=row["rpm"],
            tpm=row["tpm"],
            max_concurrency=row["max_concurrency"],
            created_at=row["created_at"],
        )

    def may_use_model(self, model_id: str) -> bool:
        return self.models is None or model_id in self.models

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view for admin responses (no key material lives here)."""
        return {
            "name": self.name,
            "models": list(self.models) if self.models is not None else None,
            "rpm": self.rpm,
            "tpm": self.tpm,
            "max_concurrency": self.max_concurrency,
            "created_at": self.created_at,
        }


@dataclass(frozen=True)
class UsageRow:
    tenant: str
    model: str
    day: str  # YYYY-MM-DD, UTC
    requests: int
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class AuditEntry:
    id: int
    ts: str  # ISO-8601 UTC
    actor: str
    action: str
    target: str
    detail: dict[str, Any]


@dataclass(frozen=True)
class ApiKeyInfo:
    """What an admin may see about a key: never the key, never the hash."""

    key_id: str
    tenant: str
    origin: str  # "generated" (by the store) or "config" (given through the environment)
    created_at: str


# SeedResult.key_status values: what seeding did with the key from the environment.
KEY_NONE = "none"  # no key given (or the tenant is deleted and stays deleted)
KEY_UNCHANGED = "unchanged"  # already stored (a legacy argon2 row is upgraded to SHA-256)
KEY_ADDED = "added"  # a new key id; the tenant's earlier config keys were revoked
KEY_REPLACED = "replaced"  # same key id, different secret: the stored digest was replaced
KEY_REVOKED = "revoked"  # the key id was revoked earlier and stays revoked


@dataclass(frozen=True)
class SeedResult:
    """What ``TenantStore.seed_tenant`` did with one tenant of the tenants file."""

    tenant: Tenant | None  # None: seeded earlier, deleted since, and not re-created
    seeded: bool  # created now, or its limits were (re-)applied from the file
    created: bool  # the tenant row was created now
    key_status: str = KEY_NONE
    key_id: str | None = None  # the public id of the key from the environment, if any
    new_key: str | None = None  # generated because the tenant was created without a key
    deleted_at: str | None = None  # set when tenant is None
