"""The tenants file: YAML schema, loader, and applying it to a TenantStore."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator

from tenancy.keys import redact
from tenancy.models import normalize_models, validate_tenant_name
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
        None, description="Environment variable holding this tenant's key (ps_<id>_<secret>).")

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
    synced: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def apply_tenants_file(store: TenantStore, tenants_file: TenantsFile,
                       environ: Mapping[str, str], actor: str = "config") -> AppliedTenants:
    """Create or update every declared tenant; tenants not in the file are left alone.

    ``environ`` is passed in (usually os.environ, possibly with the resolved
    demo key added) rather than read here, so callers and tests control it.
    """
    result = AppliedTenants()
    for spec in tenants_file.tenants:
        limits = {"models": spec.models, "rpm": spec.rpm, "tpm": spec.tpm,
                  "max_concurrency": spec.max_concurrency}
        api_key = environ.get(spec.api_key_env) if spec.api_key_env else None
        if api_key:
            try:
                store.ensure_tenant_with_key(spec.name, api_key, actor=actor, **limits)
            except ValueError as error:
                # The message never includes the key; redact() shows which one was meant.
                raise ValueError(f"tenant {spec.name!r}: ${spec.api_key_env} "
                                 f"({redact(api_key)}): {error}") from error
        elif store.get_tenant(spec.name) is not None:
            store.update_tenant(spec.name, actor=actor, **limits)
            if spec.api_key_env:
                result.warnings.append(f"tenant {spec.name!r}: ${spec.api_key_env} is not set; "
                                       "keeping its existing keys")
        else:
            _, api_key = store.create_tenant(spec.name, actor=actor, **limits)
            result.new_keys[spec.name] = api_key
        result.synced.append(spec.name)
    return result
