"""Tenant enforcement at the gateway: authentication, limits, usage, and the admin API.

An ASGI middleware runs before any body is parsed, so a request without a valid key is a 401
even when its JSON is broken, and the concurrency slot is held until a stream has ended.
The pure logic (hashing, SQLite, limiter maths) lives in `tenancy/`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import re
from pathlib import Path

from fastapi import HTTPException, Request
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from gateway.dashboard_auth import dashboard_gate, is_dashboard_path
from gateway.errors import error_body
from gateway.pool_guard import PoolGuard, read_gpu_pool, read_pool
from gateway.public_paths import is_public, refuse_unauthenticated, serve_public
from gateway.read_lanes import ReadLanes, ReadsQueued, is_read
from planner.guard import GuardPlan, unplanned_guard
from planner.outputs import GatewayEdge
from planner.profile import GatewaySpec
from system.private_files import make_private_dir, write_private
from tenancy import (
    DEMO_KEY_ENV,
    ApiKeyNotFound,
    TenantExists,
    TenantLimiter,
    TenantMetrics,
    TenantNotFound,
    TenantStore,
    apply_tenants_file,
    load_tenants_file,
    parse_api_key,
    render_metrics,
    resolve_demo_key,
)
from tenancy.client_limits import ClientLimiter
from tenancy.limits import LimitDecision, RequestTokens
from tenancy.rejections import RejectionLog

logger = logging.getLogger("poolserve.tenants")
ADMIN_KEY_ENV = "POOLSERVE_ADMIN_KEY"
# The tenants file seeds once; with this set to 1 it is applied again (revoked keys stay revoked).
RESEED_ENV = "POOLSERVE_RESEED_TENANTS"
# Operator routes outside /admin that also need the admin key: they name tenants and processes.
OPERATOR_PATHS = ("/metrics", "/status")
INGEST_PATH = re.compile(r"^/v1/collections/.+/documents$")
# Per-request scope keys. Not scope["state"]: servers may share that dict across requests.
TENANT_KEY = "poolserve.tenant"
GUARD_KEY = "poolserve.guard"
TOKENS_KEY = "poolserve.tokens"  # the request's TPM reservation, settled once its usage is known
DETACHED_KEY = "poolserve.detached"  # work that outlives the response (an ingest job): see detach()


def tenant_of(request: Request):
    """The authenticated tenant of a /v1 request (set by TenantAuthMiddleware), or None."""
    return request.scope.get(TENANT_KEY)


def detach(request: Request, task: asyncio.Task) -> None:
    """The request's work goes on in `task` after its response (an ingest job). Its concurrency slot is
    given back with the response, so the tenant can follow and cancel the job (jobs have their own
    limit, rag.max_ingest_jobs_per_tenant); its TPM reservation is held until the task ends, then
    settled to what the work used."""
    request.scope[DETACHED_KEY] = task


def guard_of(request: Request) -> "TenantGuard":
    return request.scope[GUARD_KEY]


class TenantGuard:
    """Everything tenant-related one gateway replica holds: store, limiter, metrics."""

    def __init__(self, state_dir: str, tenants_file: str | None, marks: GuardPlan | None = None,
                 gateway: GatewaySpec | None = None):
        """`marks` is the plan's pool guard section (planner/guard.py): the marks follow what the plan holds.
        None (unit tests that build a guard alone): the profile schema's fixed marks."""
        marks = marks or unplanned_guard()
        os.umask(0o077)  # tenants, usage and audit databases and key files are the owner's only
        self.state_dir = Path(state_dir)
        self.store = TenantStore(self.state_dir / "tenants.sqlite3")
        # One SQLite file shared by every gateway replica: a tenant's limits hold across replicas.
        self.limiter = TenantLimiter(self.state_dir / "limits.sqlite3")
        self.registry = CollectorRegistry()
        self.metrics = TenantMetrics(self.registry)
        self.rejections = RejectionLog(self.state_dir / "rejections.sqlite3")  # 429s per tenant and day
        # Sheds new work with 503 before the memory pool runs out (the kernel's OOM killer never decides).
        # On a discrete GPU the pool is the device's memory (planner: unified false), read through NVML.
        self.pool = PoolGuard(marks.shed_ingest_at, marks.shed_all_at, hysteresis=marks.hysteresis,
                              sample_interval_s=marks.sample_interval_s, retry_after_s=marks.retry_after_s,
                              registry=self.registry, reader=read_gpu_pool if marks.reader == "gpu" else read_pool,
                              planned_bytes=marks.planned_bytes, basis=marks.basis)
        self.shed_heaviest_at_least = marks.heaviest_at_least
        self.admin_key = os.environ.get(ADMIN_KEY_ENV) or None
        # Traffic without a valid key, per client address (planner/profile.py GatewaySpec.client_*).
        spec = gateway or GatewaySpec()
        self.clients = ClientLimiter(spec.client_max_concurrent, spec.client_requests_per_minute,
                                     spec.login_failures_per_minute, spec.tracked_clients)
        self.login_form_max_bytes = spec.login_form_max_bytes
        self.lanes = ReadLanes(spec.reads_at_once_alone, spec.reads_queue_max, spec.reads_wait_s, spec.reads_pause_ratio)
        demo_key, created_at = resolve_demo_key(self.state_dir)
        if created_at:
            logger.warning("demo tenant key written to %s (mode 0600)", created_at)
        if tenants_file:
            applied = apply_tenants_file(self.store, load_tenants_file(tenants_file),
                                         {**os.environ, DEMO_KEY_ENV: demo_key},
                                         reseed=os.environ.get(RESEED_ENV) == "1")
            for name, key in applied.new_keys.items():
                logger.warning("key for tenant %s written to %s (mode 0600)", name, self._write_key_file(name, key))
            logger.info("tenants file %s: synced %s", tenants_file, ", ".join(applied.synced) or "nothing")
            for warning in applied.warnings:
                logger.warning("tenants file: %s", warning)

    def _write_key_file(self, tenant: str, key: str) -> Path:
        path = self.state_dir / "keys" / f"{tenant}.key"
        make_private_dir(path.parent)
        return write_private(path, key + "\n", exclusive=False)  # a key written before is replaced

    def admin_allowed(self, presented: str | None) -> bool:
        return bool(self.admin_key and presented
                    and hmac.compare_digest(presented.encode(), self.admin_key.encode()))

    def authenticate(self, presented: str | None):
        """The key's tenant, or None. Keys are checked by SHA-256 (microseconds), so a flood of
        wrong secrets against a key id costs little and never locks the real key out."""
        try:
            parse_api_key(presented or "")
        except ValueError:
            return None
        return self.store.authenticate(presented)

    def observe_rejection(self, tenant: str, reason: str) -> None:
        """A 429 from a tenant limit: counted in Prometheus (this process) and per day (every replica)."""
        self.metrics.observe_rejection(tenant, reason)
        self.rejections.record(tenant, reason)

    def admit(self, tenant):
        """A concurrency lease and an RPM slot in one transaction (a spent TPM minute refuses; the estimate
        is reserved later, by reserve_tokens), or the refusal."""
        return self.limiter.acquire_and_admit(tenant, estimated_tokens=1, reserve=False)


def _work_kind(method: str, path: str) -> str | None:
    """What the pool guard weighs: ingestion (shed first), other new work, or nothing (reads, deletes)."""
    if method != "POST":
        return None
    return "ingest" if INGEST_PATH.match(path) else "work"


def app_path(scope) -> str:
    """The path inside the app: Ray Serve (and uvicorn's root_path) keep the route prefix in
    scope["path"] and name it in scope["root_path"]; auth must not depend on where the app is mounted."""
    path, root = scope.get("path", ""), scope.get("root_path", "").rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        path = path[len(root):]
    return "/" + path.lstrip("/")


def _bearer(scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


class TenantAuthMiddleware:
    """Pure ASGI middleware: admin-key and bearer auth, RPM/TPM/concurrency limits."""

    def __init__(self, app, edge: GatewayEdge):
        self.app = app
        self.guard = TenantGuard(edge.state_dir, edge.tenants_file, edge.guard, edge.gateway)
        self._closing: set[asyncio.Future] = set()  # strong references to in-progress lease releases

    async def _reject(self, scope, receive, send, status: int, message: str, headers: dict | None = None,
                      kind: str = "invalid_request_error") -> None:
        response = error_body(status, message, kind)
        for key, value in (headers or {}).items():
            response.headers[key] = value
        await response(scope, receive, send)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        guard = self.guard
        scope[GUARD_KEY] = guard
        path = app_path(scope)
        # Nothing below reads the body until a key has been accepted: refusals come from the headers.
        if is_dashboard_path(path):  # the admin key, or the session cookie its login form sets
            refusal = dashboard_gate(guard, scope, path)
            if refusal is not None:
                return await refuse_unauthenticated(guard.clients, refusal, scope, receive, send)
            if not is_public(path):
                return await self.app(scope, receive, send)
        if is_public(path):
            return await serve_public(self.app, guard.clients, guard.login_form_max_bytes, path, scope, receive, send)
        if path.startswith("/admin") or path in OPERATOR_PATHS:
            if not guard.admin_key:
                return await self._reject(scope, receive, send, 404,
                                          f"the admin API is disabled: set {ADMIN_KEY_ENV} to enable it", kind="not_found_error")
            if not guard.admin_allowed(_bearer(scope)):
                return await refuse_unauthenticated(guard.clients, _unauthenticated("missing or invalid admin key"),
                                                    scope, receive, send)
            return await self.app(scope, receive, send)
        tenant = await run_in_threadpool(guard.authenticate, _bearer(scope))
        if tenant is None:
            return await refuse_unauthenticated(
                guard.clients, _unauthenticated("missing or invalid API key: send 'Authorization: Bearer <key>'"),
                scope, receive, send)
        kind = _work_kind(scope["method"], path)
        shed = await self._shed(tenant, kind) if kind else None
        if shed:  # before admission: a shed request uses none of the tenant's limits
            guard.metrics.observe_shed(tenant.name, kind)
            return await self._reject(scope, receive, send, 503, shed, {"Retry-After": str(guard.pool.retry_after_s)},
                                      kind="service_unavailable")
        # Its own task: if the client hangs up meanwhile, the lease it takes is still given back.
        admitting = asyncio.ensure_future(run_in_threadpool(guard.admit, tenant))
        try:
            decision, reservation = await asyncio.shield(admitting)
        except asyncio.CancelledError:
            self._closing.add(admitting)
            admitting.add_done_callback(self._release_abandoned(tenant))
            raise
        if not decision.allowed:
            return await self._reject_over_limit(scope, receive, send, tenant, decision)
        scope[TENANT_KEY] = tenant
        tokens = scope[TOKENS_KEY] = RequestTokens(reservation)
        in_flight = guard.metrics.in_flight.labels(tenant=tenant.name)
        in_flight.inc()
        try:
            await self._run(scope, receive, send, tenant, path)
        finally:
            in_flight.dec()
            detached = scope.get(DETACHED_KEY)
            if detached is not None and not detached.done():  # an ingest job: settled when it ends
                await asyncio.shield(self._closing_task(self.guard.limiter.release, tenant, decision.lease_id))
                detached.add_done_callback(lambda _: self._closing_task(self._settle, tenant, tokens))
            else:
                await asyncio.shield(self._closing_task(self._close_request, tenant, tokens, decision.lease_id))

    async def _run(self, scope, receive, send, tenant, path: str) -> None:
        """The app, with the tenant's reads taking turns while other tenants work (gateway/read_lanes.py)."""
        lanes = self.guard.lanes
        async with lanes.working(tenant.name):
            if not is_read(scope["method"], path):
                return await self.app(scope, receive, send)
            try:
                async with lanes.reading(tenant.name):
                    return await self.app(scope, receive, send)
            except ReadsQueued as queued:
                await run_in_threadpool(self.guard.observe_rejection, tenant.name, "reads_queued")
                await self._reject(scope, receive, send, 429, str(queued), {"Retry-After": str(queued.retry_after_s)},
                                   kind="rate_limit_error")

    async def _shed(self, tenant, kind: str) -> str | None:
        """The pool guard's refusal of this request, if any. Who is heaviest is a read of every replica's
        leases (SQLite): in a thread, and only once the pool is past its first mark."""
        guard = self.guard
        if guard.pool.sample()[0] == "ok":
            return None
        return await run_in_threadpool(guard.pool.refusal, kind,
                                       lambda: guard.limiter.is_heaviest(tenant.name, guard.shed_heaviest_at_least))

    def _closing_task(self, close, *args) -> asyncio.Future:
        # Its own task: a client that hangs up cancels the request's, and the lease must still go back.
        closing = asyncio.ensure_future(run_in_threadpool(close, *args))
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)
        return closing

    def _settle(self, tenant, tokens: RequestTokens) -> None:
        self.guard.limiter.settle(tenant, *tokens.closing())

    def _close_request(self, tenant, tokens: RequestTokens, lease_id: str | None) -> None:
        # What was charged beyond what ran is given back (all of it when nothing ran), and the lease
        # released, in one transaction; if settling fails, the lease still goes back.
        try:
            self.guard.limiter.settle_and_release(tenant, *tokens.closing(), lease_id)
        except Exception:
            self.guard.limiter.release(tenant, lease_id)
            raise

    def _release_abandoned(self, tenant):
        """Done-callback for an admission whose request was cancelled: hand back what it took."""
        def release(task: asyncio.Future) -> None:
            self._closing.discard(task)
            if task.cancelled() or task.exception() is not None:
                return
            decision, reservation = task.result()
            if decision.allowed:
                closing = asyncio.ensure_future(run_in_threadpool(
                    self._close_request, tenant, RequestTokens(reservation), decision.lease_id))
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
        return release

    async def _reject_over_limit(self, scope, receive, send, tenant, decision) -> None:
        await run_in_threadpool(self.guard.observe_rejection, tenant.name, decision.reason)
        await self._reject(scope, receive, send, 429, over_limit_message(tenant, decision),
                           {"Retry-After": str(decision.retry_after_seconds)}, kind="rate_limit_error")


def _unauthenticated(message: str) -> Response:
    response = error_body(401, message, "authentication_error")
    response.headers["WWW-Authenticate"] = "Bearer"
    return response


# OpenAI's clients retry a 429 unless told not to: a request too large for the TPM fails the same way every time.
NO_RETRY = {"x-should-retry": "false"}


def over_limit_message(tenant, decision, what: str | None = None) -> str:
    """The 429's message. TPM refusals name the limit and the request's estimate (and the minute's use), in
    OpenAI's words ("Request too large ... Limit 20000, Requested 47352"); `what` says how it was estimated."""
    how = f" ({what})" if what else ""
    if decision.reason == "request_too_large":
        return (f"Request too large for tenant {tenant.name!r} on tokens per minute (TPM): Limit {decision.limit}, "
                f"Requested {decision.requested}. This request is estimated at {decision.requested} tokens{how}, "
                "more than the tenant may use in a minute, so it can never run: reduce the input or max_tokens, "
                "or ask for a higher tpm. Nothing was charged.")
    what_limit = {"rpm": f"{tenant.rpm} requests per minute", "tpm": f"{tenant.tpm} tokens per minute",
                  "concurrency": f"{tenant.max_concurrency} concurrent requests"}[decision.reason]
    numbers = ""
    if decision.reason == "tpm" and decision.limit is not None:
        numbers = f": Limit {decision.limit}, Used {decision.used}"
        if decision.requested is not None:
            numbers += (f", Requested {decision.requested} (this request is estimated at {decision.requested} "
                        f"tokens{': ' + what if what else ''})")
    return (f"tenant {tenant.name!r} is over its limit of {what_limit}{numbers}; retry after "
            f"{decision.retry_after_seconds}s")


def _tpm_refusal(tenant, decision, what: str | None) -> HTTPException:
    if decision.reason == "request_too_large":
        return HTTPException(429, over_limit_message(tenant, decision, what), headers=dict(NO_RETRY))
    return HTTPException(429, over_limit_message(tenant, decision, what),
                         headers={"Retry-After": str(decision.retry_after_seconds)})


async def reserve_tokens(request: Request, estimated_tokens: int, what: str = "prompt + max_tokens x n") -> None:
    """Charge a request's estimate before it runs (generation: prompt + max_tokens x n; embeddings and
    ingest: characters / 4): 429 when the tenant's minute cannot hold it, naming the limit, the minute's use
    and the estimate, with Retry-After; 429 "Request too large" when no minute could (the estimate is over
    the whole TPM), without Retry-After and with `x-should-retry: false`. A refusal charges nothing. Held
    until the request ends, then settled to what it used (record_usage reports it)."""
    tenant, tokens = tenant_of(request), request.scope.get(TOKENS_KEY)
    if tenant is None or tokens is None:
        return
    guard = guard_of(request)
    admission = await run_in_threadpool(guard.limiter.reserve_more, tenant, tokens.reservation, estimated_tokens)
    if not admission.allowed:
        await run_in_threadpool(guard.observe_rejection, tenant.name, admission.decision.reason)
        raise _tpm_refusal(tenant, admission.decision, what)
    tokens.reserved(admission.reservation)


async def refuse_if_too_large(request: Request, estimated_tokens: int, what: str) -> None:
    """The "Request too large" 429 before any work, for a request whose least possible cost is already over
    the tenant's whole TPM (a RAG query before its question is embedded); nothing is reserved here."""
    tenant = tenant_of(request)
    if tenant is None or tenant.tpm is None or estimated_tokens <= tenant.tpm:
        return
    await run_in_threadpool(guard_of(request).observe_rejection, tenant.name, "request_too_large")
    raise _tpm_refusal(tenant, LimitDecision.too_large(tenant.tpm, estimated_tokens), what)


def tpm_of(request: Request) -> int | None:
    """The caller's tenant's TPM, or None (unlimited, or no tenant)."""
    tenant = tenant_of(request)
    return None if tenant is None else tenant.tpm


async def record_usage(request: Request, model: str, usage: dict | None, status: int = 200) -> None:
    """Count one finished request for the caller's tenant (tokens as the engine reported them)."""
    tenant = tenant_of(request)
    guard = request.scope.get(GUARD_KEY)
    if tenant is None or guard is None:
        return
    prompt = int((usage or {}).get("prompt_tokens") or 0)
    completion = int((usage or {}).get("completion_tokens") or 0)
    await run_in_threadpool(guard.store.record_usage, tenant.name, model, prompt, completion)
    tokens = request.scope.get(TOKENS_KEY)
    # Covered by the request's reservation up to what it holds; beyond that charged now. The rest of
    # the reservation is refunded when the request closes (TenantAuthMiddleware._close_request).
    excess = tokens.report(prompt + completion) if tokens is not None else prompt + completion
    if excess:
        await run_in_threadpool(guard.limiter.charge_tokens, tenant, excess)
    guard.metrics.observe_request(tenant.name, model, str(status))
    guard.metrics.observe_tokens(tenant.name, model, prompt, completion)


class CreateTenantRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    models: list[str] | None = Field(None, description="Omitted: every model.")
    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    max_concurrency: int | None = Field(None, ge=1)


class TenantAdminRoutes:
    """Admin API methods mixed into the gateway (reachable only with POOLSERVE_ADMIN_KEY)."""

    async def create_tenant(self, body: CreateTenantRequest, request: Request) -> Response:
        guard: TenantGuard = guard_of(request)
        try:
            tenant, key = await run_in_threadpool(
                guard.store.create_tenant, body.name, body.models, body.rpm, body.tpm, body.max_concurrency, "admin-api")
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
