"""Pure multi-tenant logic for the gateway: keys, store, limits, config, metrics.

Nothing here imports Ray or keeps module-level mutable state; the gateway
creates one TenantStore, TenantLimiter and TenantMetrics per replica.
"""

from tenancy.config import AppliedTenants, TenantSpec, TenantsFile, apply_tenants_file, load_tenants_file
from tenancy.demo_key import DEMO_KEY_ENV, resolve_demo_key
from tenancy.keys import ApiKeyHasher, MalformedKey, generate_api_key, parse_api_key, redact
from tenancy.limits import Admission, LimitDecision, TenantLimiter, TokenReservation
from tenancy.metrics import TenantMetrics, render_metrics
from tenancy.models import ApiKeyInfo, AuditEntry, Tenant, UsageRow, validate_tenant_name
from tenancy.store import ApiKeyNotFound, TenantExists, TenantNotFound, TenantStore

__all__ = [
    "AppliedTenants",
    "TenantSpec",
    "TenantsFile",
    "apply_tenants_file",
    "load_tenants_file",
    "DEMO_KEY_ENV",
    "resolve_demo_key",
    "ApiKeyHasher",
    "MalformedKey",
    "generate_api_key",
    "parse_api_key",
    "redact",
    "Admission",
    "LimitDecision",
    "TenantLimiter",
    "TokenReservation",
    "TenantMetrics",
    "render_metrics",
    "ApiKeyInfo",
    "AuditEntry",
    "Tenant",
    "UsageRow",
    "validate_tenant_name",
    "ApiKeyNotFound",
    "TenantExists",
    "TenantNotFound",
    "TenantStore",
]
