"""The running embedded default matches its plan: memory per replica and vLLM's KV capacity."""

from __future__ import annotations

import re

import httpx

from planner.plan import build_plan
from planner.profile import load_profile

TOLERANCE = 0.15


def _plan(stack):
    return build_plan(load_profile(stack.config_path.parent / "profile.yaml"))


def test_every_replica_measures_within_15_percent_of_plan(stack, client):
    # Exercise the embedder and retriever once so their steady-state footprint is measured.
    client.post("/v1/collections/measure/documents", json={"documents": [{"id": "m", "text": "Measure me."}]})
    plan = _plan(stack)
    status = httpx.get(f"{stack.url}/status", timeout=60).json()
    errors = {}
    for replica in status["replicas"]:
        planned = plan.replica(replica["name"])
        expected = planned.planned_bytes - planned.growth_bytes  # capacity that fills with use is not resident yet
        errors[replica["name"]] = (replica["measured_bytes"] - expected) / expected
    print("plan error per replica:", {k: f"{v:+.1%}" for k, v in errors.items()})
    assert all(abs(error) <= TOLERANCE for error in errors.values()), errors


def test_vllm_kv_capacity_equals_plan_within_one_block(stack):
    plan = _plan(stack)
    log = stack.log_path.read_text(errors="replace")
    reported = [int(n.replace(",", "")) for n in re.findall(r"KV cache size: ([\d,]+) tokens", log)]
    assert reported, "vLLM did not log its KV cache size"
    assert abs(reported[-1] - plan.chat.kv_pool_tokens) <= plan.chat.block_size
