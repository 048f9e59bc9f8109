"""The dashboard's per-tenant figures for one UTC day, from the tenant store's rows (pure)."""

from __future__ import annotations


def tenants_today(tenants: list[dict], usage_rows: list, rejected: dict[str, dict[str, int]], day: str) -> list[dict]:
    """Each tenant's limits with its requests, tokens (prompt + completion) and 429s of `day`, summed
    over models as GET /admin/tenants/{name}/usage lists them."""
    figures = []
    for tenant in tenants:
        rows = [r for r in usage_rows if r.tenant == tenant["name"] and r.day == day]
        refused = rejected.get(tenant["name"], {})
        figures.append(
            {
                **tenant,
                "today": {
                    "requests": sum(r.requests for r in rows),
                    "tokens": sum(r.prompt_tokens + r.completion_tokens for r in rows),
                    "rejected": sum(refused.values()),
                    "rejected_by_reason": refused,
                },
            }
        )
    return figures


def measured_by_replica(replicas: list[dict]) -> dict[str, int]:
    """Replica name -> measured bytes, for the history (replicas that could not be measured are left out)."""
    return {r["name"]: r["measured_bytes"] for r in replicas if isinstance(r.get("measured_bytes"), int)}
