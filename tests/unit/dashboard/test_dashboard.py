"""The dashboard's pure parts: session tokens, the access gate, the memory ring, figures and HTML."""

from __future__ import annotations

from dataclasses import dataclass
from html.parser import HTMLParser

from dashboard import session
from dashboard.figures import measured_by_replica, tenants_today
from dashboard.history import MemoryHistory
from dashboard.render import page, render_sections
from gateway.middleware.dashboard_auth import dashboard_gate, is_dashboard_path
from tenancy.rejections import RejectionLog

ADMIN = "admin-key-0123456789"


def test_session_token_is_accepted_until_it_expires_and_only_for_its_admin_key():
    token = session.issue(ADMIN, now=1000.0, ttl_s=60)
    assert session.valid(ADMIN, token, now=1059.0, ttl_s=60)
    assert not session.valid(ADMIN, token, now=1061.0, ttl_s=60)  # expired
    assert not session.valid("another-admin-key", token, now=1001.0, ttl_s=60)  # the admin key changed
    expiry, nonce, signature = token.split(".")
    assert not session.valid(ADMIN, f"{int(expiry) + 3600}.{nonce}.{signature}", now=1001.0, ttl_s=60)  # edited
    assert session.issue(ADMIN, now=1000.0) != session.issue(ADMIN, now=1000.0)  # a nonce per login
    for junk in (None, "", "x", "1.2", "..", "a" * 500, "99999999999.n.sig"):
        assert not session.valid(ADMIN, junk, now=1001.0)


def test_cookie_is_httponly_strict_and_secure_only_over_https():
    header = session.set_cookie_header("tok", "/p/dashboard", secure=False)
    assert "HttpOnly" in header and "SameSite=Strict" in header and "Path=/p/dashboard" in header
    assert "Secure" not in header and "; Secure" in session.set_cookie_header("tok", "/dashboard", secure=True)
    assert session.cookie_from(f"a=b; {session.COOKIE_NAME}=tok; c=d") == "tok"
    assert session.cookie_from("a=b") is None and session.cookie_from(None) is None


@dataclass
class FakeGuard:
    admin_key: str | None

    def admin_allowed(self, presented):
        return bool(self.admin_key) and presented == self.admin_key


def _scope(method="GET", headers=()):
    return {"method": method, "headers": [(k.encode(), v.encode()) for k, v in headers]}


def test_gate_lets_in_the_admin_key_or_a_session_and_sends_others_to_the_login_form():
    guard = FakeGuard(ADMIN)
    cookie = ("cookie", f"{session.COOKIE_NAME}={session.issue(ADMIN)}")
    assert dashboard_gate(guard, _scope(headers=[("authorization", f"Bearer {ADMIN}")]), "/dashboard") is None
    assert dashboard_gate(guard, _scope(headers=[cookie]), "/dashboard/data") is None
    assert dashboard_gate(guard, _scope(), "/dashboard/login") is None
    assert dashboard_gate(guard, _scope(), "/dashboard/static/dashboard.js") is None
    page_load = dashboard_gate(guard, _scope(), "/dashboard")
    assert page_load.status_code == 303 and page_load.headers["location"] == "dashboard/login"
    assert dashboard_gate(guard, _scope(), "/dashboard/data").status_code == 401
    assert dashboard_gate(guard, _scope(headers=[("authorization", "Bearer wrong")]), "/dashboard").status_code == 303
    forged = ("cookie", f"{session.COOKIE_NAME}={session.issue('not-the-admin-key')}")
    assert dashboard_gate(guard, _scope(headers=[forged]), "/dashboard/data").status_code == 401
    assert dashboard_gate(FakeGuard(None), _scope(), "/dashboard/login").status_code == 404  # no admin key: off
    assert (
        is_dashboard_path("/dashboard") and is_dashboard_path("/dashboard/x") and not is_dashboard_path("/dashboards")
    )


def test_history_keeps_one_hour_and_a_bounded_number_of_points():
    history = MemoryHistory(max_age_s=3600, max_points=5)
    for i in range(8):
        history.add(1000.0 + i, {"chat": 100 + i, **({"embedder": 7} if i % 2 else {})})
    assert len(history) == 5
    series = history.series(now=1007.0)
    assert series["t"] == [1003.0, 1004.0, 1005.0, 1006.0, 1007.0]
    assert series["series"] == {"chat": [103, 104, 105, 106, 107], "embedder": [7, None, 7, None, 7]}
    history.add(900.0, {"chat": 1})  # out of order: dropped
    assert len(history) == 5
    assert history.series(now=1003.0 + 3600.5)["t"] == [1004.0, 1005.0, 1006.0, 1007.0]


@dataclass
class Row:
    tenant: str
    model: str
    day: str
    requests: int
    prompt_tokens: int
    completion_tokens: int


def test_tenant_figures_sum_todays_rows_over_models_and_count_429s():
    tenants = [
        {"name": "a", "rpm": 5, "tpm": None, "max_concurrency": 2, "models": None},
        {"name": "b", "rpm": None, "tpm": 100, "max_concurrency": None, "models": ["m"]},
    ]
    rows = [
        Row("a", "m", "2026-11-30", 2, 10, 5),
        Row("a", "e", "2026-11-30", 1, 7, 0),
        Row("a", "m", "2026-11-29", 9, 99, 99),
        Row("b", "m", "2026-11-29", 1, 1, 1),
    ]
    figures = tenants_today(tenants, rows, {"a": {"rpm": 3, "tpm": 1}}, "2026-11-30")
    assert figures[0]["today"] == {
        "requests": 3,
        "tokens": 22,
        "rejected": 4,
        "rejected_by_reason": {"rpm": 3, "tpm": 1},
    }
    assert figures[1]["today"] == {"requests": 0, "tokens": 0, "rejected": 0, "rejected_by_reason": {}}
    assert measured_by_replica([{"name": "x", "measured_bytes": 5}, {"name": "y", "error": "down"}]) == {"x": 5}


def test_rejection_log_counts_per_tenant_day_and_reason(tmp_path):
    log = RejectionLog(tmp_path / "rejections.sqlite3")
    for reason in ("rpm", "rpm", "tpm"):
        log.record("a", reason, day="2026-11-30")
    log.record("b", "concurrency", day="2026-11-29")
    assert log.counts(day="2026-11-30") == {"a": {"rpm": 2, "tpm": 1}}
    assert log.counts("b", day="2026-11-29") == {"b": {"concurrency": 1}}
    assert (tmp_path / "rejections.sqlite3").stat().st_mode & 0o077 == 0


class _Attributes(HTMLParser):
    def __init__(self):
        super().__init__()
        self.found: list[dict] = []

    def handle_starttag(self, tag, attrs):
        self.found.append(dict(attrs))


def _snapshot(tenant_name="t<script>"):
    status = {
        "pool": {
            "state": "ok",
            "used_bytes": 6 * 2**30,
            "limit_bytes": 24 * 2**30,
            "fraction": 0.25,
            "source": "host",
            "shed_ingest_at": 0.9,
            "shed_all_at": 0.95,
            "shed_requests": 0,
        },
        "replicas": [
            {"name": "chat", "measured_bytes": 2**30, "planned_bytes": 2 * 2**30},
            {"name": "chat-coder", "measured_bytes": 2**29, "planned_bytes": 2**30, "engine_state": "asleep"},
            {"name": "embedder", "error": "down", "planned_bytes": 2**28},
        ],
    }
    return {
        "taken_at": "2026-11-30T15:00:00+00:00",
        "day": "2026-11-30",
        "status": status,
        "tenants": [
            {
                "name": tenant_name,
                "rpm": 3,
                "tpm": None,
                "max_concurrency": None,
                "models": None,
                "today": {"requests": 4, "tokens": 50, "rejected": 1},
            }
        ],
        "collections": {"index": "flat", "data": [{"tenant": "demo", "name": "docs", "documents": 2, "chunks": 9}]},
    }


def test_sections_carry_exact_numbers_in_data_attributes_and_escape_names():
    html = render_sections(_snapshot())
    assert "<script>" not in html
    parser = _Attributes()
    parser.feed(html)
    by_key = {next(iter(a)): a for a in parser.found if a}
    pool = next(a for a in parser.found if "data-pool-used-bytes" in a)
    assert pool["data-pool-limit-bytes"] == str(24 * 2**30) and pool["data-guard-state"] == "ok"
    assert pool["data-planned-bytes"] == str(2 * 2**30 + 2**30 + 2**28)
    chat = next(a for a in parser.found if a.get("data-replica") == "chat")
    assert chat["data-measured-bytes"] == str(2**30) and chat["data-planned-bytes"] == str(2 * 2**30)
    assert chat["data-engine-state"] == ""  # always on
    coder = next(a for a in parser.found if a.get("data-replica") == "chat-coder")
    assert coder["data-engine-state"] == "asleep" and "<td>asleep</td>" in html  # on demand: its state shown
    tenant = next(a for a in parser.found if "data-tenant" in a)
    assert tenant["data-tenant"] == "t<script>" and tenant["data-rejected"] == "1" and tenant["data-tpm"] == ""
    assert next(a for a in parser.found if "data-collection" in a)["data-chunks"] == "9"
    assert by_key  # parsed
    full = page(_snapshot("plain"), refresh_s=5)
    assert "dashboard/static/uPlot.iife.min.js" in full and "<script>" not in full.replace("<script src=", "")
