"""Plain value types shared by the store, the limiter and the gateway."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

TENANT_NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


def validate_tenant_name(name: object) -> str:
    """Return ``name`` unchanged or raise ValueError saying what is wrong with it."""
    if not isinstance(name, str):
        raise ValueError(f"tenant name must be a string, got {type(name).__name__}")
    if not name:
        raise ValueError("tenant name must not be empty")
    if len(name) > 63:
        raise ValueError(f"tenant name is {len(name)} characters long; the maximum is 63")
    if not TENANT_NAME_PATTERN.match(name):
        raise ValueError(
            f"tenant name {name!r} is invalid: use lowercase letters, digits, '-' and '_', "
            "starting with a letter or digit")
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


@dataclass(frozen=True)
class Tenant:
    name: str
    models: tuple[str, ...] | None = None  # None: every served model
    rpm: int | None = None  # requests per minute; None: unlimited
    tpm: int | None = None  # tokens per minute; None: unlimited
    max_concurrency: int | None = None  # in-flight requests; None: unlimited
    created_at: str = ""

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
