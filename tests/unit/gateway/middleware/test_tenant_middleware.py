"""TenantAuthMiddleware in front of a tiny FastAPI app, mounted under a root path as Ray Serve
does: who gets in, which limits hold (across gateway replicas too), and that a request's
concurrency lease and token reservation always go back."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from fastapi import FastAPI, Request
from starlette.responses import StreamingResponse
from starlette.testclient import TestClient

from gateway.http_errors import install_error_handlers
from gateway.middleware.tenant_auth import TenantAuthMiddleware
from gateway.middleware.tenant_guard import (
    ADMIN_KEY_ENV,
    RESEED_ENV,
    detach,
    guard_of,
    record_usage,
    reserve_tokens,
    tenant_of,
)
from tenancy import DEMO_KEY_ENV, parse_api_key
from gateway.middleware.request_timing import timing_of
from tests.fakes.settings import unplanned_edge

pytestmark = pytest.mark.timeout(60)
ADMIN = "admin-" + "k" * 40
FROZEN = 6_000_000.0 + 1  # one second into a minute, so a TPM minute cannot roll over mid-test


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app, 10)

    def _state(request: Request) -> dict:
        tenant, guard = tenant_of(request), guard_of(request)
        return {
            "tenant": tenant.name,
            "in_flight": guard.limiter.in_flight(tenant.name),
            "tokens_left": guard.limiter.tokens_remaining(tenant),
        }

    @app.get("/v1/x")
    async def x(request: Request):
        return _state(request)

    @app.get("/v1/timing")
    async def timing(request: Request):
        return timing_of(request).parts_ms()

    @app.post("/v1/gen")
    async def gen(request: Request, estimate: int, used: int = 0):
        await reserve_tokens(request, estimate)
        if used:
            await record_usage(request, "m", {"prompt_tokens": used, "completion_tokens": 0})
        return _state(request)

    @app.post("/v1/job")
    async def job(request: Request):
        """Answers at once; its work (reserved 100 tokens, uses 30) goes on until /v1/finish."""
        await reserve_tokens(request, 100)

        async def work():
            await app.state.finish.wait()
            await record_usage(request, "m", {"prompt_tokens": 30, "completion_tokens": 0})

        app.state.finish = asyncio.Event()
        detach(request, asyncio.get_running_loop().create_task(work()))
        return _state(request)

    @app.get("/v1/finish")
    async def finish(request: Request):
        app.state.finish.set()
        return {}

    @app.get("/v1/boom")
    async def boom(request: Request):
        raise RuntimeError("the handler failed")

    @app.get("/v1/stream")
    async def stream(request: Request):
        async def body():
            for _ in range(3):
                yield f"{_state(request)['in_flight']}\n"

        return StreamingResponse(body(), media_type="text/plain")

    @app.get("/v1/collections/{name}")
    async def collection(name: str, request: Request):
        return _state(request)

    @app.get("/admin/tenants")
    async def admin(request: Request):
        return {"admin": True}

    @app.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    return app


@pytest.fixture
def make_mw(tmp_path, monkeypatch):
    monkeypatch.setenv(ADMIN_KEY_ENV, ADMIN)
    monkeypatch.delenv(DEMO_KEY_ENV, raising=False)
    monkeypatch.delenv(RESEED_ENV, raising=False)
    umask = os.umask(0o022)  # TenantGuard sets the process umask to 077: give it back afterwards
    os.umask(umask)
    made: list[TenantAuthMiddleware] = []

    def make(state_dir=tmp_path / "state") -> TenantAuthMiddleware:
        made.append(TenantAuthMiddleware(_app(), unplanned_edge(state_dir)))
        return made[-1]

    yield make
    os.umask(umask)
    for mw in made:
        mw.guard.store.close()
        mw.guard.limiter.close()


def _client(mw, raise_server_exceptions: bool = True) -> TestClient:
    return TestClient(mw, root_path="/api", raise_server_exceptions=raise_server_exceptions)


def _auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def _freeze(*mws) -> None:
    for mw in mws:
        mw.guard.limiter._clock = lambda: FROZEN


def test_keys_under_a_root_path(make_mw):
    mw = make_mw()
    _, key = mw.guard.store.create_tenant("acme")
    with _client(mw) as client:
        missing = client.get("/api/v1/x")
        assert missing.status_code == 401 and missing.headers["WWW-Authenticate"] == "Bearer"
        assert missing.json()["error"]["type"] == "authentication_error"
        assert client.get("/api/v1/x", headers=_auth("not-a-key")).status_code == 401
        assert client.get("/api/v1/x", headers={"Authorization": f"Basic {key}"}).status_code == 401
        ok = client.get("/api/v1/x", headers=_auth(key))
        assert ok.status_code == 200 and ok.json()["tenant"] == "acme"


def test_admin_paths_need_the_admin_key(make_mw):
    mw = make_mw()
    _, key = mw.guard.store.create_tenant("acme")
    with _client(mw) as client:
        for path in ("/api/admin/tenants", "/api/metrics", "/api/status"):
            assert client.get(path).status_code == 401, path
            assert client.get(path, headers=_auth(key)).status_code == 401, "a tenant key is not an admin key"
            assert client.get(path, headers=_auth(ADMIN + "x")).status_code == 401
        ok = client.get("/api/admin/tenants", headers=_auth(ADMIN))
        assert ok.status_code == 200 and ok.json() == {"admin": True}
        assert client.get("/api/v1/x", headers=_auth(ADMIN)).status_code == 401, "the admin key is no tenant key"


def test_admin_api_is_off_without_an_admin_key(make_mw, monkeypatch):
    monkeypatch.delenv(ADMIN_KEY_ENV)
    with _client(make_mw()) as client:
        response = client.get("/api/admin/tenants", headers=_auth(ADMIN))
        assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"


def test_healthz_is_public_and_unknown_paths_fail_closed(make_mw):
    with _client(make_mw()) as client:
        assert client.get("/api/healthz").json() == {"status": "ok"}
        for path in ("/api/nope", "/api/v2/x", "/api/healthzz", "/api/", "/api/healthz/x"):
            assert client.get(path).status_code == 401, path


def test_rpm_limit_gives_429_with_retry_after(make_mw):
    mw = make_mw()
    _, key = mw.guard.store.create_tenant("acme", rpm=3)
    with _client(mw) as client:
        assert [client.get("/api/v1/x", headers=_auth(key)).status_code for _ in range(3)] == [200] * 3
        refused = client.get("/api/v1/x", headers=_auth(key))
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["Retry-After"]) <= 60
    assert refused.json()["error"]["type"] == "rate_limit_error" and "3 requests per minute" in refused.text
    assert mw.guard.limiter.in_flight("acme") == 0


def test_two_gateway_replicas_share_one_rpm_budget(make_mw):
    first, second = make_mw(), make_mw()
    _, key = first.guard.store.create_tenant("acme", rpm=3)
    with _client(first) as one, _client(second) as two:
        codes = [client.get("/api/v1/x", headers=_auth(key)).status_code for client in (one, two, one, two, one, two)]
    assert codes == [200, 200, 200, 429, 429, 429]


def test_a_wrong_secret_flood_does_not_lock_out_the_real_key(make_mw):
    mw = make_mw()
    _, key = mw.guard.store.create_tenant("acme", rpm=3)
    wrong = f"ps_{parse_api_key(key).key_id}_{'A' * 43}"
    with _client(mw) as client:
        codes = {client.get("/api/v1/x", headers=_auth(wrong)).status_code for _ in range(200)}
        assert codes == {401}
        assert client.get("/api/v1/x", headers=_auth(key)).status_code == 200, "nor spend its RPM budget"


def test_reserve_tokens_refuses_what_does_not_fit_and_leaves_the_budget(make_mw):
    mw = make_mw()
    _freeze(mw)
    tenant, key = mw.guard.store.create_tenant("acme", tpm=100)
    with _client(mw) as client:
        used = client.post("/api/v1/gen", params={"estimate": 10, "used": 70}, headers=_auth(key))
        assert used.status_code == 200
        assert mw.guard.limiter.tokens_remaining(tenant) == 30
        refused = client.post("/api/v1/gen", params={"estimate": 50}, headers=_auth(key))
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
        assert "estimated at 50 tokens" in refused.json()["error"]["message"]
        assert mw.guard.limiter.tokens_remaining(tenant) == 30, "a refused request costs no tokens"
        fits = client.post("/api/v1/gen", params={"estimate": 30}, headers=_auth(key))
        assert fits.status_code == 200 and fits.json()["tokens_left"] == 0, "the estimate is held while it runs"
    assert mw.guard.limiter.tokens_remaining(tenant) == 30, "an unused reservation goes back"
    assert mw.guard.limiter.in_flight("acme") == 0


def test_the_concurrency_lease_is_released_after_the_request_and_after_a_failure(make_mw):
    mw = make_mw()
    _freeze(mw)
    tenant, key = mw.guard.store.create_tenant("acme", tpm=1000, max_concurrency=1)
    with _client(mw, raise_server_exceptions=False) as client:
        during = client.get("/api/v1/x", headers=_auth(key))
        assert during.status_code == 200 and during.json()["in_flight"] == 1
        assert mw.guard.limiter.in_flight("acme") == 0
        streamed = client.get("/api/v1/stream", headers=_auth(key))
        assert streamed.text == "1\n1\n1\n", "the lease is held until the stream has ended"
        assert mw.guard.limiter.in_flight("acme") == 0
        for _ in range(3):
            failed = client.get("/api/v1/boom", headers=_auth(key))
            assert failed.status_code == 500 and failed.json()["error"]["type"] == "internal_error"
            assert mw.guard.limiter.in_flight("acme") == 0
        assert mw.guard.limiter.tokens_remaining(tenant) == 1000, "a failed request's reservation goes back"
        assert client.get("/api/v1/x", headers=_auth(key)).status_code == 200


def test_a_held_lease_refuses_the_next_request_with_429(make_mw):
    mw = make_mw()
    tenant, key = mw.guard.store.create_tenant("acme", max_concurrency=1)
    held = mw.guard.limiter.try_acquire(tenant)  # another request of the tenant still running
    try:
        with _client(mw) as client:
            refused = client.get("/api/v1/x", headers=_auth(key))
        assert refused.status_code == 429 and refused.headers["Retry-After"]
        assert "1 concurrent requests" in refused.json()["error"]["message"]
    finally:
        mw.guard.limiter.release(tenant, held.lease_id)
    assert mw.guard.limiter.in_flight("acme") == 0


def test_detached_work_gives_its_slot_back_with_the_response_and_holds_its_reservation(make_mw):
    mw = make_mw()
    _freeze(mw)
    tenant, key = mw.guard.store.create_tenant("acme", tpm=1000, max_concurrency=1)
    with _client(mw) as client:
        started = client.post("/api/v1/job", headers=_auth(key))
        assert started.status_code == 200 and started.json()["in_flight"] == 1
        assert mw.guard.limiter.in_flight("acme") == 0, "the slot goes back: the tenant can follow its job"
        assert mw.guard.limiter.tokens_remaining(tenant) == 900, "the reservation stays with the work"
        assert client.get("/api/v1/finish", headers=_auth(key)).status_code == 200
        for _ in range(200):  # the settlement runs in a thread after the work's task ends
            if mw.guard.limiter.tokens_remaining(tenant) == 970:
                break
            time.sleep(0.01)
        assert mw.guard.limiter.tokens_remaining(tenant) == 970, "settled to what the work used"


def test_past_the_ingest_mark_the_heaviest_tenant_is_shed_first_and_counted(make_mw):
    from gateway.middleware.pool_guard import PoolGuard, PoolReading

    mw = make_mw()
    mw.guard.pool = PoolGuard(0.8, 0.9, reader=lambda: PoolReading(85, 100, "test pool"), registry=None)
    heavy, heavy_key = mw.guard.store.create_tenant("heavy")
    _, light_key = mw.guard.store.create_tenant("light")
    held = [mw.guard.limiter.try_acquire(heavy) for _ in range(2)]  # two of its requests still running
    try:
        with _client(mw) as client:
            shed = client.post("/api/v1/gen", params={"estimate": 1}, headers=_auth(heavy_key))
            assert shed.status_code == 503 and shed.headers["Retry-After"] == "5"
            assert "most requests in flight" in shed.json()["error"]["message"]
            assert client.post("/api/v1/gen", params={"estimate": 1}, headers=_auth(light_key)).status_code == 200
        assert mw.guard.metrics.shed.labels(tenant="heavy", kind="work")._value.get() == 1
        assert mw.guard.metrics.shed.labels(tenant="light", kind="work")._value.get() == 0
    finally:
        for lease in held:
            mw.guard.limiter.release(heavy, lease.lease_id)


def test_a_read_whose_tenants_line_is_full_is_a_429_and_other_work_goes_on(make_mw):
    mw = make_mw()
    _, key = mw.guard.store.create_tenant("acme")
    lanes = mw.guard.lanes
    # Another tenant working, a read of acme running and its line full.
    lanes._working["other"], lanes._reading["acme"], lanes._waiting["acme"] = 1, 1, lanes.queue_max
    with _client(mw) as client:
        refused = client.get("/api/v1/collections/kb", headers=_auth(key))
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
        assert "gateway.reads_queue_max" in refused.json()["error"]["message"]
        assert client.get("/api/v1/x", headers=_auth(key)).status_code == 200  # not a read: no line
        del lanes._working["other"], lanes._reading["acme"], lanes._waiting["acme"]
        assert client.get("/api/v1/collections/kb", headers=_auth(key)).status_code == 200
    assert mw.guard.rejections.counts("acme")["acme"].get("reads_queued") == 1
    assert mw.guard.limiter.in_flight("acme") == 0 and lanes._working == {}


def test_the_time_to_admit_a_request_is_marked_for_its_server_timing(make_mw):
    mw = make_mw()
    _, key = mw.guard.store.create_tenant("acme")
    with _client(mw) as client:
        parts = client.get("/api/v1/timing", headers=_auth(key)).json()
    assert list(parts) == ["admit"] and 0 <= parts["admit"] < 10_000  # key, pool guard and limits, in ms
