"""Operator routes mixed into the gateway: GET /status, GET /admin/collections and the dashboard at
/dashboard (login form, the page, its JSON refresh and its static files).

Access is checked before any of these run (TenantAuthMiddleware; gateway/middleware/dashboard_auth.py). The
pure parts (session tokens, the memory ring, the HTML) live in dashboard/.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import parse_qs

from fastapi import HTTPException, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

import dashboard
from dashboard import session
from dashboard.figures import measured_by_replica, tenants_today
from dashboard.history import MemoryHistory
from dashboard.render import login_page, page, render_sections
from gateway.on_demand_gate import OnDemandGate
from gateway.middleware.public_paths import client_address
from gateway.middleware.tenant_guard import guard_of
from system.process_memory import process_tree_memory

logger = logging.getLogger("poolserve.dashboard")
STATIC_DIR = Path(dashboard.__file__).parent / "static"
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css"}
STATIC_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,80}")
# No inline scripts, nothing from other origins, never framed (clickjacking), never cached.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}


class DashboardRoutes:
    """Needs from the gateway: _engines, _default_serve_handles, _embedder, _retriever, _settings."""

    _on_demand = OnDemandGate(None, set())  # no engine on demand unless the Ray binding hands a coordinator in

    def _start_memory_history(self) -> None:
        self._memory_history = MemoryHistory()
        self._history_task = asyncio.get_running_loop().create_task(self._sample_memory())

    async def _sample_memory(self) -> None:
        """Lives as long as the replica (its event loop ends it); one bounded measurement per period. The
        dashboard's refreshes and /status calls add points between samples."""
        while True:
            try:
                await self._measure_replicas()
            except Exception as exc:  # a replica restarting: the next sample tries again
                logger.debug("memory sample failed: %r", exc)
            await asyncio.sleep(self._settings.dashboard_history_sample_s)

    async def _measure_replicas(self) -> list[dict]:
        """Every replica's measured memory beside its plan; each measurement is also a history point."""
        calls = [self._default_serve_handles[model].memory.remote() for model in self._engines]
        coordinator = self._on_demand.measured()  # issue 48: the wake coordinator is a planned replica too
        measured = await asyncio.wait_for(
            asyncio.gather(
                *calls,
                self._embedder.memory.remote(),
                self._retriever.memory.remote(),
                *(call for _, call in coordinator),
                return_exceptions=True,
            ),
            self._settings.dashboard_measure_timeout_s,
        )
        names = [engine.replica for engine in self._engines.values()] + ["embedder", "retriever"]
        names += [name for name, _ in coordinator]
        replicas = [{"name": n, **(m if isinstance(m, dict) else {"error": str(m)})} for n, m in zip(names, measured)]
        # smaps reads take tens of ms per process: in a thread, not on the gateway's event loop
        replicas.append({"name": "gateway", **await asyncio.to_thread(process_tree_memory)})
        planned = self._settings.planned_bytes
        at_rest = self._settings.planned_at_rest_bytes
        for replica in replicas:
            replica["planned_bytes"] = planned.get(replica["name"])
            replica["planned_at_rest_bytes"] = at_rest.get(replica["name"])
        self._memory_history.add(time.time(), measured_by_replica(replicas))
        return replicas

    async def _status_body(self, request: Request) -> dict:
        replicas, stats, states = await asyncio.gather(
            self._measure_replicas(), self._retriever.stats.remote(), self._on_demand.states()
        )
        engine_states = {self._engines[model].replica: state for model, state in states.items()}
        for replica in replicas:  # on-demand engines only (issue 48): awake, asleep, waking or sleeping
            if replica["name"] in engine_states:
                replica["engine_state"] = engine_states[replica["name"]]
        for replica in replicas:  # the retriever's plan for what it holds now, not only for an empty store
            plan = self._settings.planned_contents.get(replica["name"])
            if plan is not None and replica.get("planned_at_rest_bytes") is not None:
                replica["planned_for_contents_bytes"] = replica["planned_at_rest_bytes"] + plan.bytes_for(
                    stats.get("vectors", 0), stats.get("database_bytes", 0)
                )
        return {"replicas": replicas, "retriever": stats, "pool": guard_of(request).pool.describe()}

    async def status(self, request: Request) -> Response:
        return JSONResponse(await self._status_body(request))

    async def all_collections(self, request: Request) -> Response:
        """Every tenant's collections with document and chunk counts, and the index type (admin only)."""
        return JSONResponse(await self._retriever.all_collections.remote())

    async def _snapshot(self, request: Request) -> dict:
        """Everything the page shows, read at one moment: /status, the tenants and /admin/collections."""
        guard = guard_of(request)
        day = datetime.now(timezone.utc).date().isoformat()
        status, collections = await asyncio.gather(self._status_body(request), self._retriever.all_collections.remote())
        tenants, usage, rejected = await run_in_threadpool(
            lambda: (guard.store.list_tenants(), guard.store.usage(), guard.rejections.counts(day=day))
        )
        return {
            "taken_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "day": day,
            "status": status,
            "tenants": tenants_today([t.to_dict() for t in tenants], usage, rejected, day),
            "collections": collections,
        }

    async def dashboard(self, request: Request) -> Response:
        return HTMLResponse(
            page(await self._snapshot(request), self._settings.dashboard_refresh_s), headers=PAGE_HEADERS
        )

    async def dashboard_data(self, request: Request) -> Response:
        """The refresh: the snapshot, its sections as HTML (one renderer, the server's) and the history."""
        snapshot = await self._snapshot(request)
        return JSONResponse(
            {**snapshot, "html": render_sections(snapshot), "history": self._memory_history.series(time.time())},
            headers={"Cache-Control": "no-store"},
        )

    async def dashboard_login_form(self, request: Request) -> Response:
        return HTMLResponse(login_page(), headers=PAGE_HEADERS)

    async def dashboard_login(self, request: Request) -> Response:
        """The form's admin key for a session cookie; the key itself is never stored in the browser."""
        guard, address = guard_of(request), client_address(request.scope)
        # Before the key is looked at: a client guessing keys learns nothing more once it is over.
        if (refusal := guard.clients.login_refusal(address)) is not None:
            return HTMLResponse(
                login_page(f"Too many wrong keys: try again in {refusal.retry_after_seconds} s."),
                status_code=429,
                headers={**PAGE_HEADERS, "Retry-After": str(refusal.retry_after_seconds)},
            )
        try:
            fields = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=4)
        except ValueError:  # more fields than the form has
            fields = {}
        if not guard.admin_allowed((fields.get("key") or [""])[0]):
            guard.clients.note_failed_login(address)
            return HTMLResponse(login_page("That is not the admin key."), status_code=401, headers=PAGE_HEADERS)
        response = RedirectResponse("../dashboard", status_code=303, headers=PAGE_HEADERS)
        response.headers["Set-Cookie"] = session.set_cookie_header(
            session.issue(guard.admin_key), _cookie_path(request), secure=self._cookie_secure(request)
        )
        return response

    async def dashboard_logout(self, request: Request) -> Response:
        response = RedirectResponse("login", status_code=303, headers=PAGE_HEADERS)
        response.headers["Set-Cookie"] = session.set_cookie_header(
            "", _cookie_path(request), secure=self._cookie_secure(request), max_age=0
        )
        return response

    def _cookie_secure(self, request: Request) -> bool:
        return session.cookie_secure(
            self._settings.cookie_secure,
            request.url.scheme,
            request.headers.get("x-forwarded-proto"),
            self._settings.trust_forwarded_proto,
        )

    async def dashboard_static(self, name: str) -> Response:
        path = STATIC_DIR / name
        if not STATIC_NAME.fullmatch(name) or path.suffix not in STATIC_TYPES or not path.is_file():
            raise HTTPException(404, f"no dashboard file {name!r}")
        return Response(
            await run_in_threadpool(path.read_bytes),
            media_type=STATIC_TYPES[path.suffix],
            headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
        )


def _cookie_path(request: Request) -> str:
    """The cookie goes to /dashboard only (under the route prefix, if any)."""
    return request.scope.get("root_path", "").rstrip("/") + "/dashboard"


# The page's routes stay out of the OpenAPI schema: they serve a browser, not API clients.
PAGE = {"include_in_schema": False}
DASHBOARD_ENDPOINTS = {
    "status": lambda app: app.get("/status"),
    "all_collections": lambda app: app.get("/admin/collections"),
    "dashboard": lambda app: app.get("/dashboard", **PAGE),
    "dashboard_data": lambda app: app.get("/dashboard/data", **PAGE),
    "dashboard_login_form": lambda app: app.get("/dashboard/login", **PAGE),
    "dashboard_login": lambda app: app.post("/dashboard/login", **PAGE),
    "dashboard_logout": lambda app: app.post("/dashboard/logout", **PAGE),
    "dashboard_static": lambda app: app.get("/dashboard/static/{name}", **PAGE),
}
