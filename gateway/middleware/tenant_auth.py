"""Tenant enforcement at the gateway's way in: authentication, admission to the limits, the pool guard's shedding.

An ASGI middleware runs before any body is parsed, so a request without a valid key is a 401
even when its JSON is broken, and the concurrency slot is held until a stream has ended.
What it holds per replica and charges per request is the tenant guard (gateway/middleware/tenant_guard.py).
"""

from __future__ import annotations

import asyncio
import re

from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from gateway.http_errors import error_body
from gateway.middleware.dashboard_auth import dashboard_gate, is_dashboard_path
from gateway.middleware.public_paths import is_public, refuse_unauthenticated, serve_public
from gateway.middleware.read_lanes import ReadsQueued, is_read
from gateway.middleware.request_timing import TIMING_KEY, RequestTiming
from gateway.middleware.tenant_guard import (
    ADMIN_KEY_ENV,
    DETACHED_KEY,
    GUARD_KEY,
    TENANT_KEY,
    TOKENS_KEY,
    TenantGuard,
    over_limit_message,
)
from planner.outputs import GatewayEdge
from tenancy.limits import RequestTokens

# Operator routes outside /admin that also need the admin key: they name tenants and processes.
OPERATOR_PATHS = ("/metrics", "/status")
INGEST_PATH = re.compile(r"^/v1/collections/.+/documents$")


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
        path = path[len(root) :]
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

    async def _reject(
        self,
        scope,
        receive,
        send,
        status: int,
        message: str,
        headers: dict | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        response = error_body(status, message, kind)
        for key, value in (headers or {}).items():
            response.headers[key] = value
        await response(scope, receive, send)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        timing = scope[TIMING_KEY] = RequestTiming()  # its Server-Timing header (generation routes)
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
                return await self._reject(
                    scope,
                    receive,
                    send,
                    404,
                    f"the admin API is disabled: set {ADMIN_KEY_ENV} to enable it",
                    kind="not_found_error",
                )
            if not guard.admin_allowed(_bearer(scope)):
                return await refuse_unauthenticated(
                    guard.clients, _unauthenticated("missing or invalid admin key"), scope, receive, send
                )
            return await self.app(scope, receive, send)
        tenant = await run_in_threadpool(guard.authenticate, _bearer(scope))
        if tenant is None:
            return await refuse_unauthenticated(
                guard.clients,
                _unauthenticated("missing or invalid API key: send 'Authorization: Bearer <key>'"),
                scope,
                receive,
                send,
            )
        kind = _work_kind(scope["method"], path)
        shed = await self._shed(tenant, kind) if kind else None
        if shed:  # before admission: a shed request uses none of the tenant's limits
            guard.metrics.observe_shed(tenant.name, kind)
            return await self._reject(
                scope,
                receive,
                send,
                503,
                shed,
                {"Retry-After": str(guard.pool.retry_after_s)},
                kind="service_unavailable",
            )
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
        timing.mark("admitted")
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
        """The app, with the tenant's reads taking turns while other tenants work (gateway/middleware/read_lanes.py)."""
        lanes = self.guard.lanes
        async with lanes.working(tenant.name):
            if not is_read(scope["method"], path):
                return await self.app(scope, receive, send)
            try:
                async with lanes.reading(tenant.name):
                    return await self.app(scope, receive, send)
            except ReadsQueued as queued:
                await run_in_threadpool(self.guard.observe_rejection, tenant.name, "reads_queued")
                await self._reject(
                    scope,
                    receive,
                    send,
                    429,
                    str(queued),
                    {"Retry-After": str(queued.retry_after_s)},
                    kind="rate_limit_error",
                )

    async def _shed(self, tenant, kind: str) -> str | None:
        """The pool guard's refusal of this request, if any. Who is heaviest is a read of every replica's
        leases (SQLite): in a thread, and only once the pool is past its first mark."""
        guard = self.guard
        if guard.pool.sample()[0] == "ok":
            return None
        return await run_in_threadpool(
            guard.pool.refusal, kind, lambda: guard.limiter.is_heaviest(tenant.name, guard.shed_heaviest_at_least)
        )

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
                closing = asyncio.ensure_future(
                    run_in_threadpool(self._close_request, tenant, RequestTokens(reservation), decision.lease_id)
                )
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)

        return release

    async def _reject_over_limit(self, scope, receive, send, tenant, decision) -> None:
        await run_in_threadpool(self.guard.observe_rejection, tenant.name, decision.reason)
        await self._reject(
            scope,
            receive,
            send,
            429,
            over_limit_message(tenant, decision),
            {"Retry-After": str(decision.retry_after_seconds)},
            kind="rate_limit_error",
        )


def _unauthenticated(message: str) -> Response:
    response = error_body(401, message, "authentication_error")
    response.headers["WWW-Authenticate"] = "Bearer"
    return response
