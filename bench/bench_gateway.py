"""What the stack costs over raw vLLM: the same chat load through poolserve's gateway and through
vLLM's own OpenAI server, with the same engine arguments (the embedded default's plan).

Both are driven by the real `openai` client (streaming, greedy, fixed prompts) at each
concurrency; reported: generated tokens/s, median time to first token and median request
latency, and poolserve's ratio against raw vLLM. One after the other, never together.

    flock /tmp/poolserve-heavy.lock .venv/bin/python bench/bench_gateway.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from openai import AsyncOpenAI

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.plan import build_plan  # noqa: E402
from planner.profile import load_profile  # noqa: E402
from tests.integration.conftest import DEMO_KEY, Stack, _free_port, write_stack_config  # noqa: E402

MODEL_ID = "smollm2-135m-instruct"
PROMPTS = ["Explain why the sky is blue.", "List three uses of copper.", "Describe a good breakfast.",
           "What makes a bridge strong?", "Give two tips for learning a language.", "Why do cats purr?"]


async def _one(client: AsyncOpenAI, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    started = time.perf_counter()
    first, tokens = None, 0
    stream = await client.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0,
        stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - started
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
    return first or 0.0, time.perf_counter() - started, tokens


async def load(base_url: str, key: str, requests: int, concurrency: int, max_tokens: int) -> dict:
    client = AsyncOpenAI(base_url=base_url, api_key=key, timeout=300, max_retries=0)
    await _one(client, PROMPTS[0], 8)  # warm-up, untimed
    gate = asyncio.Semaphore(concurrency)

    async def limited(i: int):
        async with gate:
            return await _one(client, PROMPTS[i % len(PROMPTS)], max_tokens)

    started = time.perf_counter()
    results = await asyncio.gather(*(limited(i) for i in range(requests)))
    wall = time.perf_counter() - started
    await client.close()
    return {"tok_s": sum(r[2] for r in results) / wall, "ttft_p50": statistics.median(r[0] for r in results),
            "latency_p50": statistics.median(r[1] for r in results), "tokens": sum(r[2] for r in results)}


def raw_vllm_command(profile_path: Path, port: int) -> list[str]:
    """vLLM's own server with exactly the engine arguments the plan gives the stack."""
    profile = load_profile(profile_path)
    engine = build_plan(profile).replica("chat").vllm
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", profile.chat.model,
               "--served-model-name", MODEL_ID, "--port", str(port), "--host", "127.0.0.1"]
    for key, value in engine.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            command.append(flag if value else f"--no-{key.replace('_', '-')}")
        elif isinstance(value, dict):
            command += [flag, json.dumps(value)]
        else:
            command += [flag, str(value)]
    return command


def run_raw(profile_path: Path, args, workdir: Path) -> dict:
    port = _free_port()
    env = {**os.environ, **build_plan(load_profile(profile_path)).replica("chat").env}
    log = open(workdir / "vllm.log", "wb")
    server = subprocess.Popen(raw_vllm_command(profile_path, port), stdout=log, stderr=subprocess.STDOUT,
                              env=env, start_new_session=True)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}/health", server, workdir / "vllm.log")
        return {c: asyncio.run(load(f"http://127.0.0.1:{port}/v1", "none", args.requests, c, args.max_tokens))
                for c in args.concurrency}
    finally:
        _stop_group(server)


def _wait_healthy(url: str, server: subprocess.Popen, log: Path, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"raw vLLM exited; see {log}")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise SystemExit(f"raw vLLM not healthy after {timeout_s:.0f}s; see {log}")


def _stop_group(server: subprocess.Popen) -> None:
    """TERM the server's whole session, then KILL whatever is left (EngineCore, Worker)."""
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(server.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server.wait(timeout=10)


def run_poolserve(args, workdir: Path) -> tuple[dict, Path]:
    port = _free_port()
    config = write_stack_config(workdir, port)
    stack = Stack(config, port, workdir / "serve.log")
    try:
        stack.start()
        return ({c: asyncio.run(load(f"{stack.url}/v1", DEMO_KEY, args.requests, c, args.max_tokens))
                 for c in args.concurrency}, workdir / "profile.yaml")
    finally:
        stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8])
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    stacked, profile_path = run_poolserve(args, workdir)
    raw = run_raw(profile_path, args, workdir)
    print(f"{args.requests} streamed chat requests per row, max_tokens {args.max_tokens}, greedy\n")
    print("| concurrency | raw vLLM tok/s | poolserve tok/s | ratio | raw TTFT p50 ms | poolserve TTFT p50 ms "
          "| raw latency p50 s | poolserve latency p50 s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in args.concurrency:
        r, p = raw[c], stacked[c]
        print(f"| {c} | {r['tok_s']:.1f} | {p['tok_s']:.1f} | {p['tok_s'] / r['tok_s']:.2f}x | {r['ttft_p50'] * 1000:.0f} "
              f"| {p['ttft_p50'] * 1000:.0f} | {r['latency_p50']:.2f} | {p['latency_p50']:.2f} |")


if __name__ == "__main__":
    main()
