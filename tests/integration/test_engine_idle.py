"""The chat engine's vLLM Worker sleeps between requests (chat.worker_idle_spin_s, vllm_bridge/cpu_worker.py).

vLLM's Worker busy-waits (sched_yield) for a second after every step: on two cores that held one of them
for a second after each request, beside other tenants' requests and the embedder (docs/SECURITY.md). The
stack's Worker busy-waits 0.05 s, so a second after a request it has used almost no CPU.
"""

from __future__ import annotations

import httpx

from bench.bench_worker_spin import cpu_in_idle_seconds, stack_worker

# vLLM's own 1 s of sched_yield used 0.8-0.9 of a core in such a second here; a sleeping Worker, a few ms.
MOST_CPU_IN_AN_IDLE_SECOND = 0.25


def test_the_engine_worker_sleeps_between_requests(stack, demo_headers):
    worker = stack_worker(stack.stack_id)
    with httpx.Client(base_url=stack.url, headers=demo_headers, timeout=120) as http:

        def say_ok():
            reply = http.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 4}
            )
            assert reply.status_code == 200, reply.text

        used = cpu_in_idle_seconds(say_ok, worker, rounds=3)
    assert max(used) < MOST_CPU_IN_AN_IDLE_SECOND, f"the Worker's CPU in the second after a request: {used}"
