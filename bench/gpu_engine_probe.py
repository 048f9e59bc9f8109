"""Each chat engine of a GPU profile's plan started alone with vLLM's LLM class and exactly the plan's
engine arguments: vLLM's own memory lines (weights, KV tokens, block size, peak activation) and NVML's
per-process bytes once it is up, against the plan. One engine at a time, each in its own process group,
killed as a group (a SIGTERM to the parent alone leaves EngineCore holding the GPU).

    python3 bench/gpu_engine_probe.py --profile configs/gh200-two-engines.yaml --out DIR

Writes DIR/engine-probe-<profile>.json after every engine (a cut-off run keeps what it measured).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.gpu_probe import GIB, VLLM_LOGGING_CONFIG, GpuSampler, parse_vllm_log  # noqa: E402
from planner.plan import build_plan  # noqa: E402
from planner.profile import load_profile  # noqa: E402

ENGINE = """
import json, sys
from vllm import LLM, SamplingParams
if __name__ == "__main__":
    kwargs = json.loads(sys.argv[1])
    llm = LLM(**kwargs)
    print("PROBE-READY", flush=True)
    out = llm.generate(["Say OK."], SamplingParams(max_tokens=8, temperature=0))
    print("PROBE-GENERATED", len(out[0].outputs[0].token_ids), flush=True)
    sys.stdin.readline()  # held up until the probe has read NVML
"""


def probe_engine(
    name: str, model: str, engine_args: dict, env: dict, log: Path, sampler: GpuSampler, timeout_s: float
) -> dict:
    kwargs = {"model": model, **engine_args}
    before = sampler.read()
    process = subprocess.Popen(
        [sys.executable, "-c", ENGINE, json.dumps(kwargs)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    started, result = time.monotonic(), {"name": name, "free_before_gib": round(before.free / GIB, 2)}
    try:
        while time.monotonic() - started < timeout_s and process.poll() is None:
            if "PROBE-GENERATED" in log.read_text(errors="replace"):
                now = sampler.read()
                result |= {
                    "ready_s": round(time.monotonic() - started, 1),
                    "gpu_processes_gib": {str(p): round(b / GIB, 3) for p, b in now.processes.items()},
                    "gpu_bytes": sum(now.processes.values()),
                    "device_used_gib": round(now.used / GIB, 2),
                }
                break
            time.sleep(1)
        else:
            result["error"] = "exited" if process.poll() is not None else f"not ready in {timeout_s:.0f} s"
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the whole group: parent, EngineCore, workers
        process.wait(timeout=30)
    text = log.read_text(errors="replace")
    result["vllm_log"] = parse_vllm_log(text)
    if "error" in result:
        result["log_tail"] = text[-3000:]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and sampler.read().processes:
        time.sleep(1)
    result["gpu_processes_after_kill"] = len(sampler.read().processes)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=240)
    args = parser.parse_args()
    from vllm_bridge.compat import adapt_engine_env

    profile = load_profile(args.profile)
    plan = build_plan(profile)
    workdir = Path(tempfile.mkdtemp(prefix="engine-probe-"))
    (workdir / "logging.json").write_text(json.dumps(VLLM_LOGGING_CONFIG))
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"profile": str(args.profile), "engines": []}
    models = dict(profile.chat_engines())
    with GpuSampler() as sampler:
        for replica in (r for r in sorted(plan.replicas, key=lambda r: r.start_order) if r.kind == "chat"):
            env = {
                **os.environ,
                **adapt_engine_env(replica.env),
                "VLLM_LOGGING_CONFIG_PATH": str(workdir / "logging.json"),
            }
            row = probe_engine(
                replica.name,
                models[replica.name].model,
                replica.vllm.as_dict(),
                env,
                args.out / f"{replica.name}.log",
                sampler,
                args.timeout,
            )
            facts = plan.engines[replica.name]
            row |= {
                "planned_gpu_bytes": replica.planned_bytes,
                "kv_tokens_planned": facts.vllm_kv_tokens,
                "weights_planned_gib": round((facts.weight_bytes + facts.drafter_weight_bytes) / GIB, 2),
                "block_planned": facts.block_size,
                "kv_cache_memory_bytes": replica.vllm.kv_cache_memory_bytes,
            }
            if row.get("gpu_bytes"):
                row["ratio"] = round(row["gpu_bytes"] / replica.planned_bytes, 4)
            report["engines"].append(row)
            (args.out / f"engine-probe-{profile.name}.json").write_text(json.dumps(report, indent=1))
            print(json.dumps({k: v for k, v in row.items() if k != "log_tail"}), flush=True)


if __name__ == "__main__":
    main()
