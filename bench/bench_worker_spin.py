"""What the vLLM Worker's busy-wait between steps (chat.worker_idle_spin_s) costs and buys, on a running stack.

Measured against the stack's gateway with the demo key, for the spin the stack was started with:
  - the Worker's CPU in the second after a request (after 0.2 s), over 5 requests: a busy-waiting Worker
    holds a core;
  - decode speed: 64 tokens (EOS ignored) for each of the 8 speed prompts of bench/data/fidelity-prompts.json (one per
    category first, bench_engine_fidelity.speed_indices),
    one at a time and 4 at once, output tokens/s of the whole run;
  - a short chat's latency (1 token), 20 in a row, median and p95.
Run it once per stack (start each with `python -m tests.integration.conftest DIR chat.worker_idle_spin_s=S`).

    .venv/bin/python bench/bench_worker_spin.py --stack DIR --label spin-0.05

Appends a row to bench/results/worker-spin.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import httpx
import psutil
import yaml

from bench.bench_engine_fidelity import speed_indices
from planner.step_worker import StepWorkerSettings
from stackctl.launcher import StackLayout
from stackctl.processes import stack_pids

ROOT = Path(__file__).resolve().parents[1]
SAY_OK = [{"role": "user", "content": "Say OK."}]
DEMO_KEY = "ps_0123456789ab_TestDemoKeyTestDemoKeyTestDemoKeyTestDemoKey123"


def stack_worker(stack_id: str) -> psutil.Process:
    """The stack's vLLM Worker process (found by the stack's marker, never by name alone)."""
    for pid in stack_pids(stack_id):
        try:
            process = psutil.Process(pid)
            if process.name() == "VLLM::Worker":
                return process
        except psutil.Error:
            continue
    raise LookupError("no vLLM Worker among this stack's processes")


def _cpu(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def cpu_in_idle_seconds(request: Callable[[], object], worker: psutil.Process, rounds: int) -> list[float]:
    """The cores `worker` used in the second after each of `rounds` requests (from 0.2 s after it: past the
    planned busy-wait and the reply's last step)."""
    used = []
    for _ in range(rounds):
        request()
        time.sleep(0.2)
        before, started = _cpu(worker), time.monotonic()
        time.sleep(1.0)
        used.append(round((_cpu(worker) - before) / (time.monotonic() - started), 3))
    return used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", type=Path, required=True, help="a dev stack's folder (tests.integration.conftest)")
    parser.add_argument("--label", required=True)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "worker-spin.json")
    args = parser.parse_args()
    profile = yaml.safe_load((args.stack / "profile.yaml").read_text())
    url = f"http://127.0.0.1:{profile['gateway']['port']}"
    worker = stack_worker(StackLayout(Path(profile["state_dir"])).stack_id)
    fidelity = json.loads((ROOT / "bench" / "data" / "fidelity-prompts.json").read_text())["prompts"]
    prompts = [fidelity[i]["messages"] for i in speed_indices(fidelity)]
    http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {DEMO_KEY}"}, timeout=300)

    def chat(messages: list[dict], tokens: int, ignore_eos: bool = False) -> float:
        started = time.perf_counter()
        reply = http.post(
            "/v1/chat/completions",
            json={"messages": messages, "max_tokens": tokens, "ignore_eos": ignore_eos, "temperature": 0},
        )
        reply.raise_for_status()
        return time.perf_counter() - started

    idle = cpu_in_idle_seconds(lambda: chat(SAY_OK, 4), worker, rounds=5)
    short = sorted(chat(SAY_OK, 1) for _ in range(20))
    decode = {}
    for concurrency in (1, 4):
        started = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda p: chat(p, 64, ignore_eos=True), prompts))
        decode[f"c{concurrency}_tok_s"] = round(64 * len(prompts) / (time.perf_counter() - started), 2)
    settings = StepWorkerSettings.from_env(worker.environ())  # the plan's (planner/engine_args.py)
    row = {
        "label": args.label,
        "spin_s": settings.idle_spin_s if settings else None,
        "worker_cpu_in_idle_second": idle,
        "short_chat_p50_s": round(statistics.median(short), 3),
        "short_chat_p95_s": round(short[18], 3),
        **decode,
        "at": time.strftime("%Y-%m-%d %H:%M"),
    }
    print(json.dumps(row))
    rows = json.loads(args.out.read_text()) if args.out.exists() else []
    args.out.write_text(json.dumps(rows + [row], indent=1) + "\n")


if __name__ == "__main__":
    main()
