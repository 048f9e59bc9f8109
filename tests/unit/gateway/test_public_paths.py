"""Nothing is read for nobody: the gateway's real middleware stack (make_app: tenant auth outermost,
then the body guard) in front of small routes, driven at the ASGI level so that the test sees whether
the body was ever received. Keyless requests are refused from their headers, public paths take no
body, and per-client limits hold for traffic without a valid key only."""

from __future__ import annotations

import asyncio
import json
import os

import pytest
from fastapi import Request
from starlette.responses import JSONResponse

from gateway.http_app import make_app
from gateway.middleware.public_paths import body_limit, body_refusal
from gateway.middleware.tenant_guard import ADMIN_KEY_ENV, RESEED_ENV
from planner.profile import GatewaySpec
from tenancy import DEMO_KEY_ENV
from tests.fakes.settings import unplanned_edge

pytestmark = pytest.mark.timeout(60)
ADMIN = "admin-" + "k" * 40
MAX_BODY = 1 << 20


@pytest.fixture
def app(tmp_path, monkeypatch):
    monkeypatch.setenv(ADMIN_KEY_ENV, ADMIN)
    monkeypatch.delenv(DEMO_KEY_ENV, raising=False)
    monkeypatch.delenv(RESEED_ENV, raising=False)
    umask = os.umask(0o022)
    os.umask(umask)
    gateway = GatewaySpec(client_max_concurrent=2, client_requests_per_minute=6).model_dump()
    built = make_app(
        unplanned_edge(tmp_path / "state", {**gateway, "max_body_bytes": MAX_BODY, "unavailable_retry_after_s": 10})
    )
    started = asyncio.Event()
    release = asyncio.Event()

    @built.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    @built.get("/dashboard/static/slow.js")
    async def slow_static():  # holds its client's slot until the test releases it
        started.set()
        await release.wait()
        return {"static": True}

    @built.post("/v1/echo")
    async def echo(request: Request):
        return {"bytes": len(await request.body()), "tenant": request.scope["poolserve.tenant"].name}

    @built.post("/dashboard/login")
    async def login(request: Request):
        return JSONResponse({"form_bytes": len(await request.body())})

    built.state.events = (started, release)
    yield built
    os.umask(umask)


class Call:
    """One ASGI request: what the app sent back, and whether it ever asked for the body."""

    def __init__(self, status: int, body: bytes, body_reads: int):
        self.status, self.body, self.body_reads = status, body, body_reads

    @property
    def message(self) -> str:
        return json.loads(self.body)["error"]["message"]


async def _call(
    app, method: str, path: str, headers: dict | None = None, body: bytes = b"", client: str = "203.0.113.7"
) -> Call:
    reads = 0
    sent: list[dict] = []

    async def receive():
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": raw,
        "client": (client, 40000),
        "server": ("127.0.0.1", 8000),
        "scheme": "http",
        "http_version": "1.1",
        "asgi": {"version": "3.0"},
    }
    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    return Call(start["status"], b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"), reads)


def run(app, *args, **kwargs) -> Call:
    return asyncio.run(_call(app, *args, **kwargs))


def _tenant_key(app) -> str:
    async def lifespan_free():  # the middleware stack is built on the first call
        await _call(app, "GET", "/healthz")

    asyncio.run(lifespan_free())
    guard = _guard(app)
    _, key = guard.store.create_tenant("acme", None, None, None, None, "test")
    return key


def _guard(app):
    stack = app.middleware_stack
    while not hasattr(stack, "guard"):
        stack = stack.app
    return stack.guard


def test_a_public_path_with_a_body_is_refused_without_reading_it(app):
    got = run(app, "GET", "/healthz", {"content-length": str(8 << 20)}, b"[[]]" * 10)
    assert got.status == 413 and got.body_reads == 0
    assert "GET /healthz takes no request body" in got.message and "it was not read" in got.message
    chunked = run(app, "GET", "/healthz", {"transfer-encoding": "chunked"})
    assert chunked.status == 413 and chunked.body_reads == 0 and "chunked" in chunked.message
    assert run(app, "GET", "/healthz").status == 200


def test_the_login_form_takes_a_small_form_only(app):
    limit = GatewaySpec().login_form_max_bytes
    ok = run(
        app,
        "POST",
        "/dashboard/login",
        {"content-length": "9", "content-type": "application/x-www-form-urlencoded"},
        b"key=wrong",
    )
    assert ok.status == 200 and json.loads(ok.body) == {"form_bytes": 9}
    big = run(app, "POST", "/dashboard/login", {"content-length": str(limit + 1)})
    assert big.status == 413 and big.body_reads == 0 and "gateway.login_form_max_bytes" in big.message
    unsized = run(app, "POST", "/dashboard/login", {"transfer-encoding": "chunked"})
    assert unsized.status == 411 and unsized.body_reads == 0


def test_a_wrong_or_missing_key_is_refused_before_the_body_is_read(app):
    for headers in ({}, {"authorization": "Bearer sk-nope"}):
        got = run(app, "POST", "/v1/echo", {**headers, "content-length": "4"}, b"[[]]", client="198.51.100.1")
        assert got.status == 401 and got.body_reads == 0
    admin = run(
        app,
        "POST",
        "/admin/tenants",
        {"authorization": "Bearer wrong", "content-length": "2"},
        b"{}",
        client="198.51.100.2",
    )
    assert admin.status == 401 and admin.body_reads == 0


def test_an_oversized_content_length_is_413_before_reading_even_with_a_key(app):
    key = _tenant_key(app)
    got = run(app, "POST", "/v1/echo", {"authorization": f"Bearer {key}", "content-length": str(MAX_BODY + 1)})
    assert got.status == 413 and got.body_reads == 0 and "gateway.max_body_bytes" in got.message
    fine = run(app, "POST", "/v1/echo", {"authorization": f"Bearer {key}", "content-length": "2"}, b"{}")
    assert fine.status == 200 and json.loads(fine.body) == {"bytes": 2, "tenant": "acme"}


def test_keyless_requests_are_limited_per_client_and_valid_keys_never_count(app):
    key = _tenant_key(app)  # one /healthz from the default client
    statuses = [run(app, "GET", "/healthz", client="192.0.2.9").status for _ in range(7)]
    assert statuses == [200] * 6 + [429]  # client_requests_per_minute=6
    wrong = run(app, "POST", "/v1/echo", {"authorization": "Bearer sk-bad", "content-length": "0"}, client="192.0.2.9")
    assert wrong.status == 429 and "gateway.client_requests_per_minute" in wrong.message
    # The same address with a valid key is served: an attacker cannot lock a tenant out.
    for _ in range(10):
        assert (
            run(
                app, "POST", "/v1/echo", {"authorization": f"Bearer {key}", "content-length": "0"}, client="192.0.2.9"
            ).status
            == 200
        )
    assert run(app, "GET", "/healthz", client="192.0.2.10").status == 200  # another client is not affected


def test_keyless_requests_in_flight_are_capped_per_client(app):
    started, release = app.state.events

    async def scenario():
        await _call(app, "GET", "/healthz")  # build the middleware stack
        held = [
            asyncio.create_task(_call(app, "GET", "/dashboard/static/slow.js", client="192.0.2.50")) for _ in range(2)
        ]
        await asyncio.wait_for(started.wait(), 5)
        await asyncio.sleep(0.05)
        third = await _call(app, "GET", "/dashboard/static/slow.js", client="192.0.2.50")
        other = await _call(app, "GET", "/healthz", client="192.0.2.51")
        release.set()
        done = await asyncio.gather(*held)
        after = await _call(app, "GET", "/healthz", client="192.0.2.50")
        return third, other, done, after

    third, other, done, after = asyncio.run(scenario())
    assert third.status == 429 and "gateway.client_max_concurrent" in third.message
    assert other.status == 200 and [c.status for c in done] == [200, 200] and after.status == 200


def test_body_rules_are_pure_functions_of_the_headers():
    assert body_limit("POST", "/dashboard/login", 1024) == 1024 and body_limit("GET", "/dashboard/login", 1024) == 0
    scope = {"method": "GET", "headers": [(b"content-length", b"12x")]}
    assert body_refusal(scope, "/healthz", 0).status_code == 400
    assert body_refusal({"method": "GET", "headers": [(b"content-length", b"0")]}, "/healthz", 0) is None
