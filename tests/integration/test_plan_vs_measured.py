"""The running embedded default matches its plan: unique memory (PSS) per replica within 10% of its
at-rest plan and under its budget, the pool's start peak inside the planned pool, vLLM's KV capacity."""

from __future__ import annotations

import re

import httpx
import pytest

from planner.plan import build_plan
from planner.profile import load_profile

TOLERANCE = 0.10
# First, on the stack as its own warm-up leaves it: a replica's heap keeps some of what it served (the
# embedder's, in glibc's arenas, now capped at two: docs/STRESS.md, "The embedder's heap after real
# documents"), so after the other tests its at-rest figure says more about them than about the plan; the
# budget after real use is test_budgets_after_real_use.py's.
pytestmark = pytest.mark.late("measures the stack")


def _plan(stack):
    return build_plan(load_profile(stack.config_path.parent / "profile.yaml"))


def test_every_replica_measures_within_10_percent_of_plan_and_under_its_budget(stack, client, admin_headers):
    # Put every replica in service first (allocator pools, tokenizer caches, SQLite pages), so the
    # footprint measured is the one the plan is for, not a just-started process.
    text = " ".join(f"Sentence {n} describes part {n} of the measuring procedure in some detail." for n in range(400))
    assert (
        client.post("/v1/collections/measure/documents", json={"documents": [{"id": "m", "text": text}]}).status_code
        == 200
    )
    assert client.post("/v1/embeddings", json={"input": [f"text number {n}" for n in range(64)]}).status_code == 200
    for n in range(3):
        assert (
            client.post(
                "/v1/rag/query", json={"collection": "measure", "question": f"What is part {n}?", "max_tokens": 16}
            ).status_code
            == 200
        )
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json={
            "model": "smollm2-135m-instruct",
            "max_tokens": 32,
            "stream": True,
            "messages": [{"role": "user", "content": "Say something."}],
        },
    ) as stream:
        assert stream.status_code == 200 and sum(1 for _ in stream.iter_lines()) > 0
    plan = _plan(stack)
    status = httpx.get(f"{stack.url}/status", headers=admin_headers, timeout=60).json()
    errors = {}
    for replica in status["replicas"]:
        planned = plan.replica(replica["name"])
        expected = planned.planned_bytes - planned.growth_bytes  # capacity that fills with use is not resident yet
        assert replica["planned_at_rest_bytes"] == expected
        errors[replica["name"]] = (replica["measured_bytes"] - expected) / expected
        # The budget is a ceiling: the plan's full bytes, growth included, hold what the replica uses.
        assert replica["measured_bytes"] <= planned.planned_bytes, replica
    print("plan error per replica:", {k: f"{v:+.1%}" for k, v in errors.items()})
    print(
        "measured MiB (anon, file, shmem):",
        {
            r["name"]: tuple(round(r.get(k, 0) / 2**20) for k in ("anon_bytes", "file_bytes", "shmem_bytes"))
            for r in status["replicas"]
        },
    )
    assert all(abs(error) <= TOLERANCE for error in errors.values()), errors


def test_start_peak_stayed_inside_the_planned_pool(stack, admin_headers):
    # The pool (a cgroup sized from the plan) counts the page cache too; its high-water mark covers the
    # ordered start (each engine's checkpoint read through the cache) and everything since.
    plan = _plan(stack)
    pool = httpx.get(f"{stack.url}/status", headers=admin_headers, timeout=60).json()["pool"]
    assert pool["source"].startswith("cgroup") and pool["peak_bytes"], pool
    planned_peak = (
        plan.pool.planned_bytes
        + plan.pool.ray_bytes
        + plan.pool.page_cache_bytes
        + max(a.start_peak_bytes for a in plan.admission)
    )
    print(
        f"pool peak {pool['peak_bytes'] / 2**30:.2f} GiB; planned {planned_peak / 2**30:.2f} GiB + reserve; "
        f"limit {pool['limit_bytes'] / 2**30:.2f} GiB"
    )
    assert pool["peak_bytes"] < pool["limit_bytes"]


def test_poolserve_status_cli_prints_planned_and_measured(stack):
    import json
    import subprocess
    import sys
    from pathlib import Path

    from tests.integration.conftest import ADMIN_KEY

    cli = Path(sys.executable).parent / "poolserve"
    out = subprocess.run(
        [str(cli), "status", "--url", stack.url, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"POOLSERVE_ADMIN_KEY": ADMIN_KEY, "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    replicas = {r["name"]: r for r in json.loads(out.stdout)["replicas"]}
    assert set(replicas) == {"chat", "embedder", "retriever", "gateway"}
    assert len(replicas["chat"]["pids"]) >= 3  # LLMServer replica, EngineCore, Worker
    assert all(r["measured_bytes"] > 0 and r["planned_bytes"] > 0 for r in replicas.values())


def test_vllm_kv_capacity_equals_plan_within_one_block(stack):
    plan = _plan(stack)
    log = stack.log_path.read_text(errors="replace")
    reported = [int(n.replace(",", "")) for n in re.findall(r"KV cache size: ([\d,]+) tokens", log)]
    assert reported, "vLLM did not log its KV cache size"
    assert abs(reported[-1] - plan.chat.kv_pool_tokens) <= plan.chat.block_size
