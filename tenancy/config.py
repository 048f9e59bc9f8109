"""The tenants file: YAML schema, loader, and seeding a TenantStore from it.

The file SEEDS tenants; after that the database is the truth. Each start
(``apply_tenants_file``):

- a tenant the file declares and the database has never seeded is created,
  or, if it already exists, gets the file's limits; either way it is then
  recorded as seeded (table ``seeded_tenants``), so a tenant added to the
  file later is seeded on the next start;
- a tenant seeded before keeps the limits the admin API gave it, and if an
  admin deleted it, it stays deleted (reported in ``warnings``);
- a key from the environment (``api_key_env``) is added if new, which revokes
  the tenant's earlier keys from the environment; a key id that was ever
  revoked (directly, by replacement, or by deleting its tenant) is never
  added back, and ``warnings`` names the tenant and key id, never the secret.

Re-seeding: to make the database match the file again, re-creating deleted
tenants and resetting their limits to the file's, start the gateway once
with re-seeding on (``apply_tenants_file(..., reseed=True)``, which the
gateway sets from POOLSERVE_RESEED_TENANTS=1), then start it without. Even
a re-seed never brings back a revoked key id: to give such a tenant a key,
make a new one (``python -m tenancy.keys``) and put it in the tenant's
``api_key_env`` variable, or create one with the admin API
(POST /admin/tenants/<name>/keys). A re-created tenant without a key in the
environment gets a generated key, as at first seeding.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator

from tenancy.keys import redact
from tenancy.models import (
    KEY_REVOKED,
    SeedResult,
    normalize_models,
    validate_tenant_name,
)
from tenancy.store import TenantStore

ENV_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class TenantSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    name: str
    models: list[str] | None = Field(None, description="Model ids this tenant may use; null = all.")
    rpm: PositiveInt | None = Field(None, description="Requests per minute; null = unlimited.")
    tpm: PositiveInt | None = Field(None, description="Tokens per minute; null = unlimited.")
    max_concurrency: PositiveInt | None = Field(None, description="In-flight requests; null = unlimited.")
    api_key_env: str | None = Field(
        None, description="Environment variable holding this tenant's key (ps_<id>_<secret>)."
    )

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        return validate_tenant_name(name)

    @field_validator("models")
    @classmethod
    def _valid_models(cls, models: list[str] | None) -> list[str] | None:
        normalized = normalize_models(models)
        return list(normalized) if normalized is not None else None

    @field_validator("api_key_env")
    @classmethod
    def _valid_env_name(cls, env_name: str | None) -> str | None:
        if env_name is not None and not ENV_VAR_NAME.match(env_name):
            raise ValueError(f"api_key_env {env_name!r} is not a valid environment variable name")
        return env_name


class TenantsFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenants: list[TenantSpec] = Field(default_factory=list)

    @field_validator("tenants")
    @classmethod
    def _unique_names(cls, tenants: list[TenantSpec]) -> list[TenantSpec]:
        seen: set[str] = set()
        for spec in tenants:
            if spec.name in seen:
                raise ValueError(f"tenant {spec.name!r} is declared twice")
            seen.add(spec.name)
        return tenants


def load_tenants_file(path: str | Path) -> TenantsFile:
    """Parse and validate a tenants YAML file; an empty file means no tenants."""
    text = Path(path).read_text(encoding="utf-8")
    data = yaml.safe_load(text) or {}
    return TenantsFile.model_validate(data)


@dataclass
class AppliedTenants:
    """What ``apply_tenants_file`` did, for the startup log."""

    # Tenants created here without a key in the environment: name -> new key,
    # which the caller must show once (it cannot be recovered later).
    new_keys: dict[str, str] = field(default_factory=dict)
    # Declared tenants that exist after applying (seeded now or earlier).
    synced: list[str] = field(default_factory=list)
    # Tenants created or given the file's limits this time (first seeding or re-seed).
    seeded: list[str] = field(default_factory=list)
    # Seeded earlier, deleted by an admin since, and so not re-created.
    deleted: list[str] = field(default_factory=list)
    # Never contain a key's secret; key ids only.
    warnings: list[str] = field(default_factory=list)


def apply_tenants_file(
    store: TenantStore,
    tenants_file: TenantsFile,
    environ: Mapping[str, str],
    actor: str = "config",
    reseed: bool = False,
) -> AppliedTenants:
    """Seed the declared tenants (see the module docstring); tenants not in the file are left alone.

    ``environ`` is passed in (usually os.environ, possibly with the resolved
    demo key added) rather than read here, so callers and tests control it.
    ``reseed`` re-applies every declared tenant and its limits, re-creating
    deleted ones; revoked key ids still stay revoked.
    """
    result = AppliedTenants()
    for spec in tenants_file.tenants:
        api_key = environ.get(spec.api_key_env) if spec.api_key_env else None
        try:
            seed = store.seed_tenant(
                spec.name,
                api_key or None,
                models=spec.models,
                rpm=spec.rpm,
                tpm=spec.tpm,
                max_concurrency=spec.max_concurrency,
                actor=actor,
                reseed=reseed,
            )
        except ValueError as error:
            # The message never includes the key; redact() shows which one was meant.
            raise ValueError(f"tenant {spec.name!r}: ${spec.api_key_env} ({redact(api_key)}): {error}") from error
        _report(result, spec, seed, bool(api_key))
    return result


def _report(result: AppliedTenants, spec: TenantSpec, seed: SeedResult, key_given: bool) -> None:
    if seed.tenant is None:
        result.deleted.append(spec.name)
        result.warnings.append(
            f"tenant {spec.name!r} was deleted ({seed.deleted_at}); not re-creating it from the "
            "tenants file (re-seed to restore it)"
        )
        return
    result.synced.append(spec.name)
    if seed.seeded:
        result.seeded.append(spec.name)
    if seed.new_key is not None:
        result.new_keys[spec.name] = seed.new_key
    if seed.key_status == KEY_REVOKED:
        result.warnings.append(
            f"tenant {spec.name!r}: key id {seed.key_id} from ${spec.api_key_env} was revoked; "
            "not re-adding it. Make a new key (python -m tenancy.keys) for "
            f"${spec.api_key_env}, or create one with the admin API"
        )
    elif spec.api_key_env and not key_given and not seed.created:
        result.warnings.append(f"tenant {spec.name!r}: ${spec.api_key_env} is not set; keeping its existing keys")
