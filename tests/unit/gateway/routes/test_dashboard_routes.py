"""The dashboard's routes behind the gateway's real middleware (tenant store, pool guard, auth), driven
without Ray: replica handles call in-process stand-ins, the retriever's a real KnowledgeStore."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from starlette.testclient import TestClient

from dashboard.history import MemoryHistory
from gateway.http_app import make_app
from gateway.routes.dashboard_api import DASHBOARD_ENDPOINTS, DashboardRoutes
from rag.store.knowledge_store import KnowledgeStore
from tests.fakes.handles import FakeHandle
from tests.fakes.settings import gateway_settings, unplanned_edge

ADMIN = "unit-admin-key-0123456789"
MIB = 2**20


class Replica:
    def __init__(self, measured: int):
        self.measured = measured

    def memory(self):
        return {"measured_bytes": self.measured, "rss_bytes": self.measured, "pids": [1]}


class RetrieverReplica(Replica):
    def __init__(self, store):
        super().__init__(300 * MIB)
        self.store = store

    def stats(self):
        return self.store.stats()

    def all_collections(self):
        return {"index": self.store.index_kind, "data": self.store.list_all_collections()}


class Gateway(DashboardRoutes):
    def __init__(self, store):
        self._engines = {"chat-model": SimpleNamespace(replica="chat")}
        self._default_serve_handles = {"chat-model": FakeHandle(Replica(900 * MIB))}
        self._embedder = FakeHandle(Replica(400 * MIB))
        self._retriever = FakeHandle(RetrieverReplica(store))
        self._settings = gateway_settings(
            planned_bytes={"chat": 1000 * MIB, "embedder": 500 * MIB, "retriever": 350 * MIB}
        )
        self._memory_history = MemoryHistory()  # the sampler task is the replica's; not started here


@pytest.fixture()
def http(tmp_path, monkeypatch):
    monkeypatch.setenv("POOLSERVE_ADMIN_KEY", ADMIN)
    store = KnowledgeStore(tmp_path / "knowledge.sqlite3", dim=4)
    store.upsert_document("demo", "handbook", "leave", ["a", "b"], np.eye(4, dtype=np.float32)[:2], {})
    app = make_app(unplanned_edge(tmp_path / "state", {"max_body_bytes": 1 << 20, "unavailable_retry_after_s": 10}))
    gateway = Gateway(store)
    for name, route in DASHBOARD_ENDPOINTS.items():
        route(app)(getattr(gateway, name))
    with TestClient(app, follow_redirects=False) as client:
        yield client


def test_login_sets_a_session_that_opens_the_page_and_its_data(http):
    assert http.get("/dashboard").headers["location"] == "dashboard/login"
    assert "Admin key" in http.get("/dashboard/login").text
    assert http.post("/dashboard/login", data={"key": "wrong"}).status_code == 401
    signed_in = http.post("/dashboard/login", data={"key": ADMIN})
    assert signed_in.status_code == 303 and "HttpOnly" in signed_in.headers["set-cookie"]
    page = http.get("/dashboard")
    assert page.status_code == 200 and 'data-replica="chat"' in page.text
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    data = http.get("/dashboard/data").json()
    assert [r["name"] for r in data["status"]["replicas"]] == ["chat", "embedder", "retriever", "gateway"]
    assert data["collections"]["data"] == [{"tenant": "demo", "name": "handbook", "documents": 1, "chunks": 2}]
    assert data["tenants"] == [] and 'id="pool"' in data["html"]
    assert data["history"]["series"]["chat"][-1] == 900 * MIB and len(data["history"]["t"]) == 2  # page + data
    out = http.post("/dashboard/logout")
    assert out.status_code == 303 and "Max-Age=0" in out.headers["set-cookie"]
    assert http.get("/dashboard/data").status_code == 401


def test_admin_key_as_bearer_opens_status_collections_and_the_page(http):
    admin = {"Authorization": f"Bearer {ADMIN}"}
    assert http.get("/status").status_code == 401
    status = http.get("/status", headers=admin).json()
    assert status["replicas"][0] == {
        "name": "chat",
        "measured_bytes": 900 * MIB,
        "rss_bytes": 900 * MIB,
        "pids": [1],
        "planned_bytes": 1000 * MIB,
        "planned_at_rest_bytes": None,
    }
    assert http.get("/admin/collections", headers=admin).json()["index"] == "flat"
    assert http.get("/dashboard", headers=admin).status_code == 200
    assert http.get("/dashboard/static/dashboard.js").headers["content-type"].startswith("text/javascript")
    assert http.get("/dashboard/static/uPlot.LICENSE").status_code == 404


def test_the_login_form_answers_429_after_a_few_wrong_keys_without_checking_the_next(http):
    from planner.profile import GatewaySpec

    allowed = GatewaySpec().login_failures_per_minute
    assert [http.post("/dashboard/login", data={"key": f"wrong{i}"}).status_code for i in range(allowed)] == [
        401
    ] * allowed
    locked = http.post("/dashboard/login", data={"key": ADMIN})  # even the right key: it is not looked at
    assert locked.status_code == 429 and int(locked.headers["retry-after"]) >= 1
    assert "Too many wrong keys" in locked.text and "set-cookie" not in locked.headers


def test_the_cookie_secure_flag_follows_the_profile_not_the_scheme_alone():
    from dashboard.session import cookie_secure

    assert cookie_secure(True, "http", None, False) and not cookie_secure(False, "https", "https", True)
    assert cookie_secure("auto", "https", None, False)
    assert not cookie_secure("auto", "http", "https", False)  # a client may send the header itself
    assert cookie_secure("auto", "http", "https, http", True)  # the TLS proxy's, when configured
    assert not cookie_secure("auto", "http", "http", True)


def test_behind_a_tls_proxy_the_login_cookie_is_secure(tmp_path, monkeypatch):
    monkeypatch.setenv("POOLSERVE_ADMIN_KEY", ADMIN)
    store = KnowledgeStore(tmp_path / "knowledge.sqlite3", dim=4)
    app = make_app(unplanned_edge(tmp_path / "state", {"max_body_bytes": 1 << 20, "unavailable_retry_after_s": 10}))
    gateway = Gateway(store)
    gateway._settings = gateway._settings.model_copy(update={"trust_forwarded_proto": True})
    for name, route in DASHBOARD_ENDPOINTS.items():
        route(app)(getattr(gateway, name))
    with TestClient(app, follow_redirects=False) as client:
        plain = client.post("/dashboard/login", data={"key": ADMIN})
        proxied = client.post("/dashboard/login", data={"key": ADMIN}, headers={"X-Forwarded-Proto": "https"})
    assert "Secure" not in plain.headers["set-cookie"] and "; Secure" in proxied.headers["set-cookie"]
