"""The dashboard at /dashboard in a real browser: Debian's chromium, driven by Selenium through
/usr/bin/chromedriver. It signs in with the admin key, waits for a refresh, reads every number the page
shows (data-* attributes, read in one script run so they are one moment) and checks them against
/status, /admin/tenants/{name}/usage and /admin/collections read right after; then saves the screenshot
README shows (docs/img/dashboard.png)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import ADMIN_KEY, ROOT

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
SCREENSHOT = ROOT / "docs" / "img" / "dashboard.png"
EMBED_MODEL = "all-minilm-l6-v2"
WAIT_S = 90
# Measured memory moves between two reads (allocator, page cache); the pool's use on a shared host more.
REPLICA_TOLERANCE = 0.10
POOL_TOLERANCE_OF_LIMIT = 0.05

READ_PAGE = """
const pick = (sel, names) => Array.from(document.querySelectorAll(sel)).map(e => {
  const out = {}; for (const n of names) out[n] = e.getAttribute('data-' + n); return out; });
const pool = document.getElementById('pool');
return {
  taken_at: document.getElementById('snapshot').getAttribute('data-taken-at'),
  points: document.getElementById('memory-chart').getAttribute('data-points'),
  canvases: document.querySelectorAll('#memory-chart canvas').length,
  pool: Object.fromEntries(['pool-used-bytes', 'pool-limit-bytes', 'guard-state', 'shed-ingest-at', 'shed-all-at',
                            'planned-bytes'].map(n => [n, pool.getAttribute('data-' + n)])),
  replicas: pick('[data-replica]', ['replica', 'planned-bytes', 'measured-bytes']),
  tenants: pick('[data-tenant]', ['tenant', 'requests', 'tokens', 'rejected', 'rpm', 'tpm', 'max-concurrency']),
  collections: pick('[data-collection]', ['collection', 'documents', 'chunks']),
  index: document.getElementById('collections').getAttribute('data-index'),
};
"""


@pytest.fixture()
def browser(tmp_path):
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        pytest.fail(
            "chromium and chromedriver are missing: `apt-get install -y chromium chromium-driver` "
            "(make setup-browser, which .ci/run runs as root)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1280,1500",
        f"--user-data-dir={tmp_path / 'profile'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(WAIT_S)
        driver.set_script_timeout(WAIT_S)
        yield driver
    finally:
        driver.quit()  # also ends chromium and chromedriver


@pytest.fixture()
def busy_tenant(stack, admin_headers):
    """A tenant with two requests, one 429 and a collection today: numbers the page must show."""
    name = f"dash-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=stack.url, timeout=120) as http:
        created = http.post("/admin/tenants", json={"name": name, "rpm": 2}, headers=admin_headers)
        assert created.status_code == 201, created.text
        key = {"Authorization": f"Bearer {created.json()['api_key']}"}
        try:
            ingest = http.post(
                "/v1/collections/handbook/documents",
                headers=key,
                json={
                    "documents": [
                        {"id": "leave", "text": "Annual leave is 25 days. Carry-over is capped at 5 days."},
                        {"id": "travel", "text": "Book trains for trips under 600 km. Flights need approval."},
                    ]
                },
            )
            assert ingest.status_code == 200, ingest.text
            assert (
                http.post("/v1/embeddings", headers=key, json={"model": EMBED_MODEL, "input": "hi"}).status_code == 200
            )
            refused = http.post("/v1/embeddings", headers=key, json={"model": EMBED_MODEL, "input": "hi"})
            assert refused.status_code == 429, refused.text  # rpm 2: the ingest, one embedding, then this
            yield name
        finally:
            http.delete(f"/admin/tenants/{name}", headers=admin_headers)


def test_dashboard_needs_the_admin_key_and_its_cookie_is_httponly_and_strict(stack):
    with httpx.Client(base_url=stack.url, timeout=60) as http:
        page = http.get("/dashboard")
        assert page.status_code == 303 and page.headers["location"] == "dashboard/login"
        assert http.get("/dashboard/data").status_code == 401
        assert http.get("/admin/collections").status_code == 401
        wrong = http.post("/dashboard/login", data={"key": "not-the-admin-key"})
        assert wrong.status_code == 401 and "not the admin key" in wrong.text and "set-cookie" not in wrong.headers
        signed_in = http.post("/dashboard/login", data={"key": ADMIN_KEY})
        assert signed_in.status_code == 303 and signed_in.headers["location"] == "../dashboard"
        cookie = signed_in.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/dashboard" in cookie
        assert ADMIN_KEY not in cookie
        data = http.get("/dashboard/data")  # the cookie jar now holds the session
        assert data.status_code == 200 and data.json()["status"]["pool"]["limit_bytes"] > 0
        assert "script-src 'self'" in http.get("/dashboard").headers["content-security-policy"]
        assert http.get("/dashboard/static/uPlot.iife.min.js").status_code == 200
        for bad in ("..%2Fsession.py", "x%00.js", "uPlot.LICENSE", "nope.js"):
            assert http.get(f"/dashboard/static/{bad}").status_code == 404
        crowded = http.post(
            "/dashboard/login",
            content=b"a=1&b=2&c=3&d=4&e=5&key=x",
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        assert crowded.status_code == 401


def test_dashboard_in_chromium_shows_what_status_and_admin_say(stack, admin_headers, busy_tenant, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{stack.url}/dashboard")
    WebDriverWait(browser, WAIT_S).until(lambda d: d.current_url.endswith("/dashboard/login"))
    browser.find_element(By.ID, "key").send_keys(ADMIN_KEY)
    browser.find_element(By.ID, "sign-in").click()
    # Signed in, and the page's own refresh has run: the sections were swapped in and the chart drawn.
    WebDriverWait(browser, WAIT_S).until(
        lambda d: (
            d.current_url.endswith("/dashboard")
            and d.execute_script("return document.querySelectorAll('#memory-chart canvas').length") > 0
        )
    )
    shown = browser.execute_script(READ_PAGE)
    with httpx.Client(base_url=stack.url, headers=admin_headers, timeout=120) as http:
        status = http.get("/status").json()
        usage = http.get(f"/admin/tenants/{busy_tenant}/usage").json()
        tenants = {t["name"]: t for t in http.get("/admin/tenants").json()["data"]}
        collections = http.get("/admin/collections").json()

    pool = status["pool"]
    assert shown["pool"]["guard-state"] == pool["state"]
    assert int(shown["pool"]["pool-limit-bytes"]) == pool["limit_bytes"]
    assert float(shown["pool"]["shed-ingest-at"]) == pool["shed_ingest_at"]
    assert float(shown["pool"]["shed-all-at"]) == pool["shed_all_at"]
    assert (
        abs(int(shown["pool"]["pool-used-bytes"]) - pool["used_bytes"]) <= POOL_TOLERANCE_OF_LIMIT * pool["limit_bytes"]
    )
    planned = {r["name"]: r["planned_bytes"] for r in status["replicas"]}
    assert int(shown["pool"]["planned-bytes"]) == sum(p or 0 for p in planned.values())
    measured = {r["name"]: r["measured_bytes"] for r in status["replicas"]}
    assert {r["replica"] for r in shown["replicas"]} == set(measured)
    for row in shown["replicas"]:
        assert int(row["planned-bytes"]) == planned[row["replica"]]
        assert int(row["measured-bytes"]) == pytest.approx(measured[row["replica"]], rel=REPLICA_TOLERANCE)
    assert int(shown["points"]) >= 1 and shown["canvases"] >= 1

    today = shown["taken_at"][:10]
    rows = [r for r in usage["usage"] if r["day"] == today]
    page_tenant = next(t for t in shown["tenants"] if t["tenant"] == busy_tenant)
    assert int(page_tenant["requests"]) == sum(r["requests"] for r in rows) >= 2
    assert int(page_tenant["tokens"]) == sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows) > 0
    assert int(page_tenant["rejected"]) == sum(usage["rejected_today"].values()) == 1
    assert page_tenant["rpm"] == str(tenants[busy_tenant]["rpm"]) == "2" and page_tenant["tpm"] == ""
    assert {t["tenant"] for t in shown["tenants"]} == set(tenants)

    assert shown["index"] == collections["index"]
    expected = {f"{c['tenant']}/{c['name']}": (c["documents"], c["chunks"]) for c in collections["data"]}
    assert {c["collection"]: (int(c["documents"]), int(c["chunks"])) for c in shown["collections"]} == expected
    assert expected[f"{busy_tenant}/handbook"][0] == 2

    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(SCREENSHOT))
    assert Path(SCREENSHOT).stat().st_size > 10_000
