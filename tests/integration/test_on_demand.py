"""On-demand engines on a CPU (issue 48), on their own stack: configs/cpu-on-demand.yaml's two SmolLM2
engines in a pool that holds one of them awake. vLLM's CPU platform has no sleep mode: an engine sleeps by
stopping (its EngineCore and Workers exit) and wakes by a cold start plus its warm-up.

At start the larger engine (smollm2-135m-instruct) is awake and the 6-layer cut asleep (never started). A
request to the asleep one puts the awake one to sleep first (its vLLM processes gone, its replica's measured
memory down in /status), then wakes it and answers; /v1/models shows the states; the first engine then wakes
again on its own request. The seconds each step took are printed (docs/PLANNER.md quotes them).
"""

from __future__ import annotations

import time

import httpx
import psutil
import pytest

from tests.integration.conftest import (
    ADMIN_KEY,
    DEMO_KEY,
    SESSION_STACKS,
    Stack,
    launch_ahead,
    new_stack,
    used_later,
)
from tests.integration.test_embedder_variant import PROFILE as MPNET_PROFILE

pytestmark = [pytest.mark.late("stops the stack"), pytest.mark.slow]

BIG, SMALL = "smollm2-135m-instruct", "smollm2-135m-draft6"
REPLICA = {BIG: "chat", SMALL: "chat-smollm2-135m-draft6"}
DEMO = {"Authorization": f"Bearer {DEMO_KEY}"}
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def on_demand_stack(tmp_path_factory, request):
    for session_stack in SESSION_STACKS:  # one engine pool at a time
        session_stack.stop()
    running = new_stack(tmp_path_factory, "on-demand", "cpu-on-demand.yaml")
    try:
        print(f"\non-demand stack healthy in {running.start():.0f}s")
        if used_later(request, "mpnet_stack"):
            # The mpnet stack (the last stage) starts while this module waits on its engines' cold starts:
            # its own engine pool beside this one, both sized well under the host (13 and 11.75 GiB limits,
            # about 5 GiB used each), never two starts at once on the 2 cores.
            try:
                launch_ahead(tmp_path_factory, "mpnet", MPNET_PROFILE)
            except Exception as exc:  # that module's fixture launches it again and fails there, not here
                print(f"the mpnet stack did not launch ahead: {exc}")
        yield running
    finally:
        running.stop()


def _states(stack: Stack) -> dict[str, str]:
    cards = httpx.get(f"{stack.url}/v1/models", headers=DEMO, timeout=60).json()["data"]
    return {card["id"]: card.get("status") for card in cards}


def _engine_replica(stack: Stack, model: str) -> dict:
    replicas = httpx.get(f"{stack.url}/status", headers=ADMIN, timeout=120).json()["replicas"]
    return next(r for r in replicas if r["name"] == REPLICA[model])


def _ask(stack: Stack, model: str, stream: bool = False) -> tuple[str, float]:
    started = time.monotonic()
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": stream,
    }
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", headers=DEMO, json=body, timeout=600) as response:
        text = response.read().decode()
        assert response.status_code == 200, text
    return text, time.monotonic() - started


def _gone(pids: list[int]) -> bool:
    return not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)


def test_a_request_wakes_the_asleep_engine_after_putting_the_awake_one_to_sleep(on_demand_stack):
    stack = on_demand_stack
    states = _states(stack)
    assert {k: v for k, v in states.items() if k in REPLICA} == {BIG: "awake", SMALL: "asleep"}
    assert set(states.values()) == {"awake", "asleep"}  # the embedder (always on) is awake

    text, seconds = _ask(stack, BIG)
    assert '"choices"' in text
    print(f"awake engine answered in {seconds:.1f}s")

    big_awake = _engine_replica(stack, BIG)
    assert len(big_awake["pids"]) > 1, big_awake  # the replica and its vLLM EngineCore (+ Workers)
    small_asleep = _engine_replica(stack, SMALL)
    assert len(small_asleep["pids"]) == 1, small_asleep  # started asleep: no engine processes

    text, seconds = _ask(stack, SMALL, stream=True)  # streamed: the wake happens before the first byte
    assert "data: " in text and "[DONE]" in text
    print(f"asleep engine answered after its neighbour's sleep and its own cold start: {seconds:.1f}s")
    assert {k: v for k, v in _states(stack).items() if k in REPLICA} == {BIG: "asleep", SMALL: "awake"}

    big_asleep = _engine_replica(stack, BIG)
    engine_pids = [pid for pid in big_awake["pids"] if pid not in big_asleep["pids"]]
    assert engine_pids and _gone(engine_pids), (big_awake["pids"], big_asleep["pids"])
    freed = big_awake["measured_bytes"] - big_asleep["measured_bytes"]
    print(
        f"{BIG} asleep: {len(engine_pids)} engine processes gone, measured {big_awake['measured_bytes'] / 2**20:.0f} "
        f"-> {big_asleep['measured_bytes'] / 2**20:.0f} MiB"
    )
    assert freed > 200 * 2**20, (big_awake, big_asleep)  # weights, KV pool and the engine's processes
    assert big_asleep.get("engine_state") == "asleep" and _engine_replica(stack, SMALL).get("engine_state") == "awake"

    text, seconds = _ask(stack, BIG)  # and back
    assert '"choices"' in text
    print(f"{BIG} woke again (after {SMALL}'s sleep) and answered in {seconds:.1f}s")
    assert {k: v for k, v in _states(stack).items() if k in REPLICA} == {BIG: "awake", SMALL: "asleep"}

    metrics = httpx.get(f"{stack.url}/metrics", headers=ADMIN, timeout=60).text
    assert f'poolserve_on_demand_wakes_total{{model="{SMALL}"}} 1.0' in metrics
    assert f'poolserve_on_demand_wakes_total{{model="{BIG}"}} 1.0' in metrics
    assert f'poolserve_on_demand_sleeps_total{{model="{BIG}",reason="room"}} 1.0' in metrics
    print("\n".join(line for line in metrics.splitlines() if line.startswith("poolserve_on_demand")))
    # a planned sleep is no engine failure: vLLM's output task is stopped first (vllm_bridge/compat.py)
    assert "output_handler failed" not in stack.log_path.read_text(errors="replace")
