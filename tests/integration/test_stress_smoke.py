"""Runs late (it kills replicas; before the stacks of their own): `poolserve stress
--quick --layers 1-6`, what `make stress-smoke` runs, against the session's real stack, with real tenants
it creates through the admin API and deletes. Every layer's verdict is asserted, not only that it ran;
layer 7 (a whole-stack restart) runs in the full `make stress` (docs/STRESS.md), and
tests/unit/rag/store/test_upgrade_fixture.py opens an older schema's state."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest

from stress.thermal import find_reader
from tests.integration.conftest import ADMIN_KEY, ROOT

pytestmark = [pytest.mark.late("loads the stack"), pytest.mark.slow]

SMOKE_LAYERS = "1-6"
SMOKE_BUDGET_S = 1200  # bounded: layer 2 prefills about 8k tokens (160-800 prompt tokens/s on 2 cores, by host)


@pytest.mark.timeout(SMOKE_BUDGET_S + 300)
def test_stress_smoke_passes_every_layer_against_the_real_stack(stack, admin_headers, tmp_path):
    out = tmp_path / "stress"
    env = {**os.environ, "POOLSERVE_ADMIN_KEY": ADMIN_KEY, "PYTHONPATH": str(ROOT)}
    env.pop("POOLSERVE_PROFILE", None)
    started = time.monotonic()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.main",
            "stress",
            "--serve-config",
            str(stack.config_path),
            "--pool",
            str(stack.pool_bytes),
            "--quick",
            "--layers",
            SMOKE_LAYERS,
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=SMOKE_BUDGET_S,
    )
    seconds = time.monotonic() - started
    print(f"stress smoke: {seconds:.0f} s\n{(out / 'stress.md').read_text() if (out / 'stress.md').exists() else ''}")
    assert (out / "stress.json").exists(), run.stderr[-3000:]
    report = json.loads((out / "stress.json").read_text())
    layers = {layer["layer"]: layer for layer in report["layers"]}
    failed = {
        n: [c for c in layer["checks"] if not c["ok"]] for n, layer in layers.items() if layer["verdict"] == "fail"
    }
    reader, why = find_reader()
    expected = {1: "pass", 2: "pass", 3: "pass", 4: "pass", 5: "pass", 6: "pass" if reader else "not measurable"}
    assert {n: layer["verdict"] for n, layer in layers.items()} == expected, failed
    assert run.returncode == 0, run.stderr[-2000:]

    # The figures each verdict rests on are in the report.
    assert set(layers[1]["figures"]["latency per route (sequential)"]) == {"chat", "rag", "embeddings"}
    routes = layers[3]["figures"]["per route"]
    assert set(routes) == {"chat", "rag", "embeddings", "ingest"} and all(r["ok"] > 0 for r in routes.values())
    assert all(r["p99_s"] is not None for r in routes.values())
    # --quick: the whole context (StressSpec.quick_long_context_fractions), plain and streamed
    assert [row["context"] for row in layers[2]["figures"]["long prompts"]] == ["100%", "100%"]
    assert set(layers[4]["figures"]["per length bucket"]) == {"short", "medium", "long"}
    kills = layers[5]["figures"]["kills"]
    assert [k["killed"] for k in kills] == ["gateway"]  # StressSpec.quick_kill_targets
    assert all(k["healthy_s"] is not None for k in kills)
    if not reader:
        assert any("not measurable here" in note for note in layers[6]["notes"]), layers[6]
        assert why in layers[6]["figures"]["source"]

    # The run's tenants are gone, and the stack is healthy for whatever runs next.
    with httpx.Client(base_url=stack.url, headers=admin_headers, timeout=60) as admin:
        names = [t["name"] for t in admin.get("/admin/tenants").json()["data"]]
        assert not [n for n in names if n.startswith("stress-")], names
        assert admin.get("/healthz").status_code == 200
