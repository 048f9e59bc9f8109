"""The admin API: tenants, their keys, usage, the audit log and the metrics (reachable only with POOLSERVE_ADMIN_KEY).

The auth middleware (gateway/middleware/tenant_auth.py) checks the admin key before any of these runs.
"""

from __future__ import annotations

import json

from fastapi import HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from gateway.on_demand_gate import OnDemandGate
from gateway.middleware.tenant_guard import TenantGuard, guard_of
from tenancy import ApiKeyNotFound, TenantExists, TenantNotFound, parse_api_key, render_metrics


class CreateTenantRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    models: list[str] | None = Field(None, description="Omitted: every model.")
    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    max_concurrency: int | None = Field(None, ge=1)


class TenantAdminRoutes:
    """Admin API methods mixed into the gateway (reachable only with POOLSERVE_ADMIN_KEY)."""

    _on_demand = OnDemandGate(None, set())  # no engine on demand unless the Ray binding hands a coordinator in

    async def create_tenant(self, body: CreateTenantRequest, request: Request) -> Response:
        guard: TenantGuard = guard_of(request)
        try:
            tenant, key = await run_in_threadpool(
                guard.store.create_tenant, body.name, body.models, body.rpm, body.tpm, body.max_concurrency, "admin-api"
            )
        except TenantExists:
            raise HTTPException(409, f"tenant {body.name!r} already exists")
        except ValueError as exc:
            raise HTTPException(422, str(exc))
        return JSONResponse({"tenant": tenant.to_dict(), "api_key": key}, status_code=201)

    async def list_tenants(self, request: Request) -> Response:
        tenants = await run_in_threadpool(guard_of(request).store.list_tenants)
        return JSONResponse({"object": "list", "data": [t.to_dict() for t in tenants]})

    async def delete_tenant(self, name: str, request: Request) -> Response:
        guard: TenantGuard = guard_of(request)
        if await run_in_threadpool(guard.store.get_tenant, name) is None:
            raise HTTPException(404, f"tenant {name!r} not found")
        # Knowledge bases first: if the retriever is down this fails (503) with the tenant still there,
        # so the DELETE can be retried; a later tenant of the same name never inherits the documents.
        await self._retriever.delete_tenant.remote(name)
        try:
            await run_in_threadpool(guard.store.delete_tenant, name, "admin-api")
        except TenantNotFound:
            raise HTTPException(404, f"tenant {name!r} not found")
        guard.metrics.forget_tenant(name)
        await run_in_threadpool(guard.limiter.forget, name)
        return JSONResponse({"deleted": name})

    async def tenant_usage(self, name: str, request: Request) -> Response:
        guard: TenantGuard = guard_of(request)
        usage = await run_in_threadpool(guard.store.usage, name)
        if not usage and await run_in_threadpool(guard.store.get_tenant, name) is None:
            raise HTTPException(404, f"tenant {name!r} not found")
        rows = [json.loads(json.dumps(row.__dict__, default=str)) for row in usage]
        rejected = (await run_in_threadpool(guard.rejections.counts, name)).get(name, {})
        return JSONResponse({"tenant": name, "usage": rows, "rejected_today": rejected})

    async def create_key(self, name: str, request: Request) -> Response:
        """Another key for a tenant (rotation: create the new key, move clients, revoke the old)."""
        try:
            key = await run_in_threadpool(guard_of(request).store.create_api_key, name, "admin-api")
        except TenantNotFound:
            raise HTTPException(404, f"tenant {name!r} not found")
        return JSONResponse({"tenant": name, "key_id": parse_api_key(key).key_id, "api_key": key}, status_code=201)

    async def list_keys(self, name: str, request: Request) -> Response:
        store = guard_of(request).store
        if await run_in_threadpool(store.get_tenant, name) is None:
            raise HTTPException(404, f"tenant {name!r} not found")
        keys = await run_in_threadpool(store.list_api_keys, name)
        return JSONResponse({"tenant": name, "data": [dict(k.__dict__) for k in keys]})

    async def revoke_key(self, name: str, key_id: str, request: Request) -> Response:
        try:
            await run_in_threadpool(guard_of(request).store.revoke_api_key, name, key_id, "admin-api")
        except (ApiKeyNotFound, TenantNotFound):
            raise HTTPException(404, f"key {key_id!r} of tenant {name!r} not found")
        return JSONResponse({"revoked": key_id, "tenant": name})

    async def audit(self, request: Request) -> Response:
        entries = await run_in_threadpool(guard_of(request).store.audit_log, 200)
        return JSONResponse({"data": [json.loads(json.dumps(e.__dict__, default=str)) for e in entries]})

    async def metrics(self, request: Request) -> Response:
        body, content_type = render_metrics(guard_of(request).registry)
        body += await self._on_demand.metrics_text()  # the pool's wakes and sleeps (one coordinator per pool)
        return Response(body, media_type=content_type)


ADMIN_ENDPOINTS = {
    "create_tenant": lambda app: app.post("/admin/tenants"),
    "list_tenants": lambda app: app.get("/admin/tenants"),
    "delete_tenant": lambda app: app.delete("/admin/tenants/{name}"),
    "tenant_usage": lambda app: app.get("/admin/tenants/{name}/usage"),
    "create_key": lambda app: app.post("/admin/tenants/{name}/keys"),
    "list_keys": lambda app: app.get("/admin/tenants/{name}/keys"),
    "revoke_key": lambda app: app.delete("/admin/tenants/{name}/keys/{key_id}"),
    "audit": lambda app: app.get("/admin/audit"),
    "metrics": lambda app: app.get("/metrics"),
}
