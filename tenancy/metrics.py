"""Per-tenant Prometheus metrics, registered on a registry the caller owns.

Label values come from authenticated tenants and served model ids only, so
unauthenticated traffic cannot create new series.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest


class TenantMetrics:
    def __init__(self, registry: CollectorRegistry, namespace: str = "poolserve") -> None:
        self.registry = registry
        self.requests = Counter(
            "tenant_requests",
            "Requests by tenant, model and HTTP status.",
            ["tenant", "model", "status"],
            namespace=namespace,
            registry=registry,
        )
        self.tokens = Counter(
            "tenant_tokens",
            "Tokens by tenant, model and kind (prompt or completion).",
            ["tenant", "model", "kind"],
            namespace=namespace,
            registry=registry,
        )
        self.rejections = Counter(
            "tenant_rejections",
            "Requests refused by a tenant limit (rpm, tpm, concurrency, model).",
            ["tenant", "reason"],
            namespace=namespace,
            registry=registry,
        )
        self.shed = Counter(
            "tenant_shed_requests",
            "Requests the pool guard refused (503) before they ran, by tenant and kind (ingest or work).",
            ["tenant", "kind"],
            namespace=namespace,
            registry=registry,
        )
        self.in_flight = Gauge(
            "tenant_in_flight_requests",
            "Requests currently being served, by tenant.",
            ["tenant"],
            namespace=namespace,
            registry=registry,
        )

    def observe_request(self, tenant: str, model: str, status: int | str) -> None:
        self.requests.labels(tenant=tenant, model=model, status=str(status)).inc()

    def observe_tokens(self, tenant: str, model: str, prompt_tokens: int, completion_tokens: int) -> None:
        if prompt_tokens > 0:
            self.tokens.labels(tenant=tenant, model=model, kind="prompt").inc(prompt_tokens)
        if completion_tokens > 0:
            self.tokens.labels(tenant=tenant, model=model, kind="completion").inc(completion_tokens)

    def observe_rejection(self, tenant: str, reason: str) -> None:
        self.rejections.labels(tenant=tenant, reason=reason).inc()

    def observe_shed(self, tenant: str, kind: str) -> None:
        self.shed.labels(tenant=tenant, kind=kind).inc()

    def forget_tenant(self, tenant: str) -> None:
        """Drop a deleted tenant's series so they stop being exported."""
        for metric in (self.requests, self.tokens, self.rejections, self.shed, self.in_flight):
            metric.remove_by_labels({"tenant": tenant})


def render_metrics(registry: CollectorRegistry) -> tuple[bytes, str]:
    """Body and Content-Type for a /metrics response."""
    return generate_latest(registry), CONTENT_TYPE_LATEST
