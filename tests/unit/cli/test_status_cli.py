"""`poolserve status`: the table of planned (whole and at rest) against measured bytes."""

from __future__ import annotations

import httpx
from typer.testing import CliRunner

from cli.main import app

MiB = 2**20
STATUS = {
    "replicas": [
        {
            "name": "embedder",
            "planned_bytes": 900 * MiB,
            "planned_at_rest_bytes": 800 * MiB,
            "measured_bytes": 880 * MiB,
            "anon_bytes": 430 * MiB,
            "file_bytes": 450 * MiB,
            "pids": [11],
        }
    ]
}


def test_status_compares_measured_with_the_plan_at_rest(monkeypatch):
    def fake_get(url, timeout, headers):
        assert url == "http://gw:8000/status" and headers == {"Authorization": "Bearer admin"}
        return httpx.Response(200, json=STATUS, request=httpx.Request("GET", url))

    monkeypatch.setattr(httpx, "get", fake_get)
    monkeypatch.setenv("POOLSERVE_ADMIN_KEY", "admin")
    result = CliRunner().invoke(app, ["status", "--url", "http://gw:8000"])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "embedder" in line)
    assert "+10.0%" in row and "800.0 MiB" in row and "430.0 MiB" in row


def test_status_names_the_problem_when_the_gateway_refuses(monkeypatch):
    monkeypatch.setattr(
        httpx,
        "get",
        lambda url, timeout, headers: httpx.Response(401, text="bad admin key", request=httpx.Request("GET", url)),
    )
    monkeypatch.setenv("POOLSERVE_ADMIN_KEY", "wrong")
    result = CliRunner().invoke(app, ["status"])
    assert result.exit_code == 1 and "401" in result.output
