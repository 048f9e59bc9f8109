"""The stack runs inside a real memory pool (a cgroup sized from its plan), and the pool guard sheds
load before the pool runs out: a helper process in the same pool allocates memory until the guard
trips; requests get 503 + Retry-After, no replica dies, and after the helper frees its memory requests
succeed again."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from system.cgroup import own_cgroup

STEP_MIB = 128
# Allocates STEP_MIB per line read on stdin (touching every page so it is resident), answers "ok".
ALLOCATOR = f"""
import sys
held = []
for _ in sys.stdin:
    block = bytearray({STEP_MIB} * 2**20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    held.append(block)
    print("ok", flush=True)
"""


def _pool_of(stack):
    pools = {own_cgroup(pid).path for pid in stack.pids() if own_cgroup(pid) is not None}
    assert len(pools) == 1, f"the stack's processes are in {pools}"
    return own_cgroup(stack.pids()[0])


def test_every_process_of_the_stack_is_in_one_pool_of_the_planned_size(stack, admin_headers):
    pool = _pool_of(stack)
    assert pool.limit_bytes() == stack.pool_bytes
    assert pool.usage_bytes() < stack.pool_bytes
    guard = httpx.get(f"{stack.url}/status", headers=admin_headers, timeout=60).json()["pool"]
    assert guard["state"] == "ok" and guard["limit_bytes"] == stack.pool_bytes and "cgroup" in guard["source"]
    # Anyone may ask /healthz whether the guard sheds, never the pool's bytes or its cgroup's path.
    assert httpx.get(f"{stack.url}/healthz", timeout=30).json()["pool"] == {"state": "ok"}


def _oom_kills(pool) -> int:
    events = pool.path / ("memory.oom_control" if pool.version == 1 else "memory.events")
    for line in events.read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def _guard_state(stack) -> str:
    return httpx.get(f"{stack.url}/healthz", timeout=30).json()["pool"]["state"]


def test_the_guard_sheds_load_before_the_pool_runs_out_and_recovers(stack, client):
    pool = _pool_of(stack)
    before, kills_before = set(stack.pids()), _oom_kills(pool)
    helper = subprocess.Popen(
        [sys.executable, "-c", ALLOCATOR], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        pool.add(helper.pid)
        states, ingest_refused, chat_refused = [], None, None
        for _ in range(stack.pool_bytes // (STEP_MIB * 2**20)):
            helper.stdin.write("grow\n")
            helper.stdin.flush()
            assert helper.stdout.readline().strip() == "ok", "the allocator died (OOM?)"
            time.sleep(0.3)  # past the guard's sampling interval
            states.append(_guard_state(stack))
            if states[-1] != "ok" and ingest_refused is None:
                ingest_refused = client.post(
                    "/v1/collections/squeeze/documents",
                    json={"documents": [{"id": "d", "text": "refused while squeezed"}]},
                )
            if states[-1] == "shedding_all":
                chat_refused = client.post(
                    "/v1/chat/completions",
                    json={
                        "model": "smollm2-135m-instruct",
                        "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 2,
                    },
                )
                break
        else:
            pytest.fail(f"the guard never shed all work; states {states}")
        for refused in (ingest_refused, chat_refused):
            assert refused.status_code == 503 and int(refused.headers["Retry-After"]) >= 1, refused.text
            assert "memory pool" in refused.json()["error"]["message"]
        assert client.get("/v1/collections").status_code == 200, "reads still work while shedding"
        metrics = httpx.get(
            f"{stack.url}/metrics", headers={"Authorization": "Bearer test-admin-key-0123456789"}, timeout=30
        ).text
        assert "poolserve_pool_guard_state 2.0" in metrics
    finally:
        helper.kill()
        helper.wait(timeout=30)
    assert before <= set(stack.pids()), "a replica died while the pool was squeezed"
    assert _oom_kills(pool) == kills_before, "the kernel's OOM killer ran in the pool"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _guard_state(stack) != "ok":
        time.sleep(1)
    assert _guard_state(stack) == "ok"
    assert (
        client.post(
            "/v1/collections/squeeze/documents",
            json={"documents": [{"id": "d", "text": "stored once the pool recovered"}]},
        ).status_code
        == 200
    )
    print(f"squeeze: guard states {states}")


def test_status_plans_the_retriever_for_what_it_holds(stack, client, admin_headers):
    posted = client.post(
        "/v1/collections/contents-plan/documents",
        json={"documents": [{"id": f"c{i}", "text": f"Contents plan passage {i}. " * 40} for i in range(20)]},
    )
    assert posted.status_code == 200, posted.text
    status = httpx.get(f"{stack.url}/status", headers=admin_headers, timeout=60).json()
    retriever = next(r for r in status["replicas"] if r["name"] == "retriever")
    assert status["retriever"]["vectors"] >= posted.json()["chunks"] and status["retriever"]["database_bytes"] > 0
    assert retriever["planned_at_rest_bytes"] < retriever["planned_for_contents_bytes"] <= retriever["planned_bytes"]
    assert retriever["measured_bytes"] <= retriever["planned_bytes"]
    assert all("planned_for_contents_bytes" not in r for r in status["replicas"] if r["name"] != "retriever")
