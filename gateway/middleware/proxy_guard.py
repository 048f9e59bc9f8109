"""Refusals that Ray Serve's HTTP proxy makes itself, before a request is routed to the gateway replica, and
its answer to a request whose gateway replica died under it (UnansweredIsUnavailable: 503, not Uvicorn's 500).

A public path (/healthz, /docs, /openapi.json, the dashboard's static files) takes no body, which the
gateway refuses from the headers (413, unread: gateway/middleware/public_paths.py). Made in the gateway, each such
refusal still costs the proxy a route to the replica and the replica an ASGI request; a keyless flood of
them, in bursts of 60 connections at once, is what slowed another tenant's requests on two shared cores
(docs/SECURITY.md). Here the same check answers in the proxy. The gateway keeps its own check: a stack
started by `serve run` without the launcher has no proxy callback.

Refused fast, a flooding client comes straight back: each refusal was cheap, but hundreds a second of them
still cost the proxy's event loop, which every tenant's requests share (docs/SECURITY.md). No honest client
sends a body to a public path, so the refusal is answered after `refusal_delay_s` (gateway.refusal_delay_s):
the connection waits idle, its body unread, and a flooding client sends at most one request per connection
per delay. At most `refusal_delay_max` connections wait at once; beyond them the refusal is immediate.

The launcher installs it through Ray's RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH, with its settings in
POOLSERVE_PROXY_GUARD (JSON: the app's route prefix, gateway.login_form_max_bytes and the delay). This module
must stay light: the proxy imports it when it starts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os

from starlette.middleware import Middleware

from gateway.error_body import error_body
from gateway.middleware.dashboard_auth import LOGIN
from gateway.middleware.public_paths import body_limit, body_refusal, is_public

SETTINGS_ENV = "POOLSERVE_PROXY_GUARD"
CALLBACK = "gateway.middleware.proxy_guard.middlewares"
logger = logging.getLogger("ray.serve")


def proxy_env(
    route_prefix: str,
    login_form_max_bytes: int,
    refusal_delay_s: float = 0.0,
    refusal_delay_max: int = 0,
    retry_after_s: int = 0,
) -> dict[str, str]:
    """What the launcher adds to Ray's environment so that every proxy it starts refuses here (and, with
    `retry_after_s`, answers 503 for a request its replica died under)."""
    return {
        "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": CALLBACK,
        SETTINGS_ENV: json.dumps(
            {
                "route_prefix": route_prefix,
                "login_form_max_bytes": login_form_max_bytes,
                "refusal_delay_s": refusal_delay_s,
                "refusal_delay_max": refusal_delay_max,
                "retry_after_s": retry_after_s,
            }
        ),
    }


def path_in_app(path: str, route_prefix: str) -> str | None:
    """`path` relative to the app mounted at `route_prefix`, or None when it is outside the app."""
    prefix = "/" + route_prefix.strip("/")
    if prefix == "/":
        return path
    if path == prefix or path.startswith(prefix + "/"):
        return "/" + path[len(prefix) :].lstrip("/")
    return None


class PublicBodyRefusal:
    """Pure ASGI middleware: a public request whose headers announce a body it may not carry gets the
    gateway's own refusal (400/411/413) here; the login form, whose POST carries a small body, and every
    other request go on to the gateway."""

    def __init__(
        self,
        app,
        route_prefix: str = "/",
        login_form_max_bytes: int = 0,
        refusal_delay_s: float = 0.0,
        refusal_delay_max: int = 0,
    ):
        self.app = app
        self.route_prefix = route_prefix
        self.login_form_max_bytes = login_form_max_bytes
        self.refusal_delay_s = refusal_delay_s
        self.refusal_delay_max = refusal_delay_max
        self.delayed = 0  # refusals waiting out their delay now

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            path = path_in_app(scope.get("path", ""), self.route_prefix)
            if path is not None and path != LOGIN and is_public(path):
                limit = body_limit(scope["method"], path, self.login_form_max_bytes)
                refused = body_refusal(scope, path, limit)
                if refused is not None:
                    refused.headers["Connection"] = "close"  # the body stays unread; the connection cannot be reused
                    await self._delay()
                    return await refused(scope, receive, send)
        await self.app(scope, receive, send)

    async def _delay(self) -> None:
        if self.refusal_delay_s <= 0 or self.delayed >= self.refusal_delay_max:
            return
        self.delayed += 1
        try:
            await asyncio.sleep(self.refusal_delay_s)
        finally:
            self.delayed -= 1


class UnansweredIsUnavailable:
    """Pure ASGI middleware: a request the proxy returns without answering gets 503 with Retry-After.

    When the gateway replica a request was routed to dies under it (killed, out of memory, replaced), Ray
    Serve's proxy logs the actor's error and sends nothing (http_util.send_http_response_on_exception answers
    only 408/429/503), and Uvicorn then answers a bare "500 Internal Server Error". For the client that
    request met a replica that was going away, as the ones sent while it is down do (503 + Retry-After from
    the next replica), never a server fault to report. A response already started (a stream cut by the
    death) is left as it is: its status line is gone."""

    def __init__(self, app, retry_after_s: int):
        self.app = app
        self.retry_after_s = retry_after_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:  # noqa: BLE001 - what Uvicorn would turn into a 500, if nothing was sent yet
            if started:
                raise
            logger.warning(
                "poolserve: %s %s failed in the proxy (%s): 503", scope.get("method"), scope.get("path"), exc
            )
        if not started:
            unavailable = error_body(
                503, "the gateway replica went away while handling this request; retry", "service_unavailable"
            )
            unavailable.headers["Retry-After"] = str(self.retry_after_s)
            await unavailable(scope, receive, send)


def middlewares() -> list[Middleware]:
    """Ray's proxy callback: the middlewares its HTTP app runs, from POOLSERVE_PROXY_GUARD (Ray wraps its app
    in them in order: the last is outermost)."""
    settings = json.loads(os.environ.get(SETTINGS_ENV) or "{}")
    if not settings:
        return []
    retry_after_s = settings.pop("retry_after_s", 0)
    logger.info("poolserve: the proxy refuses bodies on public paths itself (%s)", settings)
    guards = [Middleware(PublicBodyRefusal, **settings)]
    if retry_after_s:
        guards.append(Middleware(UnansweredIsUnavailable, retry_after_s=retry_after_s))
    return guards
