"""The benchmark harness end to end (`bench/run.py smoke`, what `make bench-smoke` runs), against the
session's stack instead of a private one: one stack start fewer in CI. The serving comparison drives the
stack's gateway and then a raw vLLM server started from the same profile's plan with vLLM's own load
generator, with CPU accounting per process; then the retrieval and limiter benchmarks. Every result file
is read back and checked, not only written. The figures of a run beside the suite are not benchmark
figures (docs/BENCHMARKS.md has those, from `make bench`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import httpx
import pytest

from tests.integration.conftest import ROOT, create_tenant

pytestmark = [pytest.mark.late("loads the stack"), pytest.mark.slow]

SMOKE_TIMEOUT_S = 900  # raw vLLM's start (1-2 minutes on 2 cores), 2 x 5 requests, retrieval at N=2000


@pytest.fixture()
def bench_tenant(stack, admin_headers):
    """A tenant of its own, so that other tests' use of the demo tenant's minute cannot 429 the load."""
    name, key = create_tenant(
        stack, admin_headers, name=f"bench-{uuid.uuid4().hex[:8]}", rpm=600, tpm=1_000_000, max_concurrency=4
    )
    yield key
    assert httpx.delete(f"{stack.url}/admin/tenants/{name}", headers=admin_headers, timeout=30).status_code == 200


@pytest.mark.timeout(SMOKE_TIMEOUT_S + 120)
def test_bench_smoke_measures_the_stack_raw_vllm_retrieval_and_the_limiter(stack, bench_tenant, tmp_path):
    env = {**os.environ, "POOLSERVE_BENCH_API_KEY": bench_tenant, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "run.py"),
            "smoke",
            "--stack",
            str(stack.config_path),
            "--out-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
    )
    assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])

    serving = json.loads((tmp_path / "serving.json").read_text())
    assert serving["config"]["stack"] == "already running"
    by_server = {row["server"]: row for row in serving["rows"]}
    assert set(by_server) == {"poolserve", "raw vllm"}
    for server, row in by_server.items():
        assert row["completed"] == 4 and not row.get("failed"), (server, row)
        assert row["total_output_tokens"] == 4 * 32, (server, row)  # ignore_eos: exactly output_len each
        assert row["output_throughput"] > 0 and row["median_ttft_ms"] > 0, (server, row)
        assert row["cpu_s_per_1k_tokens"], f"{server}: no CPU accounted to its processes"
    # The stack's CPU is charged to its own processes (found by the stack's marker), raw vLLM's to its tree.
    assert {"gateway replica", "vLLM worker"} <= set(by_server["poolserve"]["cpu_s_per_1k_tokens"]), by_server
    assert {"vLLM API server", "vLLM worker"} <= set(by_server["raw vllm"]["cpu_s_per_1k_tokens"]), by_server
    assert serving["metrics"]["tok_s_ratio_random_c1"] > 0
    # One stream's first token, split by the gateway's Server-Timing header (raw vLLM's server sends none).
    first = serving["metrics"]["first_token"]
    assert set(first["poolserve"]["server_timing_ms_p50"]) == {"admit", "prepare", "wake", "engine"}, first
    assert first["raw vllm"]["server_timing_ms_p50"] == {} and first["raw vllm"]["ttft_ms_p50"] > 0, first
    split = first["stack_against_raw"]
    assert 0 < split["gateway_ms"] < first["poolserve"]["ttft_ms_p50"], first

    retrieval = json.loads((tmp_path / "retrieval.json").read_text())
    measured = {(row["path"], row["kind"]) for row in retrieval["rows"] if row["n"] == 2000}
    assert {("faiss", "flat"), ("store", "flat"), ("numpy", "(baseline for flat)")} <= measured, measured
    assert any(path == "faiss" and kind.startswith("hnsw") for path, kind in measured), measured
    assert all(row["recall"] is not None and 0 < row["recall"] <= 1 for row in retrieval["rows"]), retrieval["rows"]
    limits = json.loads((tmp_path / "limits.json").read_text())
    assert limits["rows"] and all(row["rounds"] == 2000 and row["median_us"] > 0 for row in limits["rows"])
