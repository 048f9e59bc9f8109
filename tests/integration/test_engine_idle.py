"""The chat engine's vLLM Worker sleeps between requests (chat.worker_idle_spin_s, serve/cpu_worker.py).

vLLM's Worker busy-waits (sched_yield) for a second after every step: on two cores that held one of them
for a second after each request, beside other tenants' requests and the embedder (docs/SECURITY.md). The
stack's Worker busy-waits 0.05 s, so a second after a request it has used almost no CPU.
"""

from __future__ import annotations

import time

import httpx
import psutil

# vLLM's own 1 s of sched_yield used 0.8-0.9 of a core in such a second here; a sleeping Worker, a few ms.
MOST_CPU_IN_AN_IDLE_SECOND = 0.25


def _worker(stack) -> psutil.Process:
    for pid in stack.pids():
        try:
            process = psutil.Process(pid)
            if process.name() == "VLLM::Worker":
                return process
        except psutil.Error:
            continue
    raise AssertionError("no vLLM Worker among this stack's processes")


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def test_the_engine_worker_sleeps_between_requests(stack, demo_headers):
    worker = _worker(stack)
    used = []
    with httpx.Client(base_url=stack.url, headers=demo_headers, timeout=120) as http:
        for _ in range(3):
            reply = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Say OK."}],
                                                            "max_tokens": 4})
            assert reply.status_code == 200, reply.text
            time.sleep(0.2)  # past the planned busy-wait, and the reply's last step
            before, started = _cpu_seconds(worker), time.monotonic()
            time.sleep(1.0)
            used.append((_cpu_seconds(worker) - before) / (time.monotonic() - started))
    assert max(used) < MOST_CPU_IN_AN_IDLE_SECOND, f"the Worker's CPU in the second after a request: {used}"
