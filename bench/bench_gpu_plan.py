"""Plan against measured on a GPU: start the whole stack from a GPU profile with `poolserve up`, use it
(chat on every engine, embeddings, ingest, a RAG query with citations, all through the openai client),
and compare every replica's GPU memory with its plan; then `poolserve down` and check the GPU is empty.

Recorded: NVML samples of the device and of each process through the start (the free memory at each
engine's start), nvidia-smi's per-process memory once healthy, torch.cuda's figures in the embedder
(/status), vLLM's memory lines per worker (weights, available KV, KV tokens, CUDA graphs, peak activation),
the start order and the GPU after `down`. Optional: a squeeze (a helper process takes GPU memory until the
pool guard sheds: 503 + Retry-After, no replica lost, recovery once it lets go) and ingest through the stack
against raw sentence-transformers on the same GPU.

    python3 bench/bench_gpu_plan.py --profile configs/gh200-two-engines.yaml --out DIR [--squeeze] [--ingest]

Writes DIR/gpu-plan-<profile>.json and prints the table (docs/GPU.md).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.gpu_probe import GIB, VLLM_LOGGING_CONFIG, GpuSampler, role_of, vllm_logs_by_pid  # noqa: E402
from bench.gpu_squeeze import ingest_ratio, squeeze  # noqa: E402
from bench.harness.stack import poolserve_stack  # noqa: E402
from planner.plan import build_plan  # noqa: E402
from planner.profile import load_profile  # noqa: E402
from stackctl.launcher import StackLayout  # noqa: E402

TOLERANCE = 0.05  # each replica's GPU bytes within +-5% of its plan (issue's goal)
DOC = ("The H200 has 141 GB of HBM3e. Its memory bandwidth is 4.8 TB/s. poolserve plans every byte of it: "
       "weights, KV cache, recurrent state, activations and CUDA contexts, before anything starts.")


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def use_the_stack(base_url: str, key: str, profile) -> dict:
    """Every kind of request once, through the real openai client; what came back, briefly."""
    import httpx
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key=key, timeout=300)
    out: dict = {"chat": {}}
    for _, engine in profile.chat_engines():
        reply = client.chat.completions.create(model=engine.model_id, max_tokens=16, temperature=0,
                                               messages=[{"role": "user", "content": "Say OK."}])
        out["chat"][engine.model_id] = {"finish_reason": reply.choices[0].finish_reason,
                                        "completion_tokens": reply.usage.completion_tokens}
    emb = client.embeddings.create(model=profile.embedder.model_id, input=["GPU memory", "a second input"])
    out["embeddings"] = {"vectors": len(emb.data), "dimension": len(emb.data[0].embedding)}
    headers = {"Authorization": f"Bearer {key}"}
    ingest = httpx.post(f"{base_url}/v1/collections/gpu/documents", headers=headers, timeout=300,
                        json={"documents": [{"id": "h200", "text": DOC, "metadata": {"source": "gpu"}}]})
    out["ingest"] = {"status": ingest.status_code, "body": ingest.json()}
    rag = httpx.post(f"{base_url}/v1/rag/query", headers=headers, timeout=300,
                     json={"collection": "gpu", "question": "What is the H200's memory bandwidth?",
                           "max_tokens": 16, "min_score": -1})
    body = rag.json()
    out["rag"] = {"status": rag.status_code, "citations": len(body.get("citations") or []),
                  "cited": [c.get("document_id") for c in body.get("citations") or []]}
    chat_rag = client.chat.completions.create(model=profile.chat.model_id, max_tokens=8, temperature=0,
                                              messages=[{"role": "user", "content": "H200 bandwidth?"}],
                                              extra_body={"rag": {"collection": "gpu", "min_score": -1}})
    out["chat_rag_citations"] = len((chat_rag.model_extra or {}).get("citations") or [])
    return out


def measured_by_replica(plan, sampler: GpuSampler, seen: dict, logs: dict) -> dict[str, dict]:
    """Each GPU process, by the replica it belongs to: vLLM workers in the order they appeared (engines
    start one at a time, in the plan's order), the embedder by its title."""
    now = sampler.read()
    engines = [r.name for r in sorted(plan.replicas, key=lambda r: r.start_order) if r.kind == "chat"]
    workers = sorted((pid for pid in now.processes if role_of(_title(pid)) == "vllm_worker"),
                     key=lambda pid: seen[pid].t if pid in seen else 0)
    result: dict[str, dict] = {}
    for name, pid in zip(engines, workers):
        result[name] = {"pid": pid, "gpu_bytes": now.processes[pid], "vllm_log": logs.get(pid, {}),
                        "free_before_start_bytes": seen[pid].free if pid in seen else None}
    others = {pid: b for pid, b in now.processes.items() if pid not in workers}
    for pid, nbytes in others.items():
        role = role_of(_title(pid))
        entry = result.setdefault(role if role != "other" else f"pid {pid}", {"pid": pid, "gpu_bytes": 0})
        entry["gpu_bytes"] += nbytes
    result["_device"] = {"used_bytes": now.used, "free_bytes": now.free}
    return result


def compare(plan, measured: dict) -> list[dict]:
    rows = []
    for r in plan.replicas:
        if not r.planned_bytes:
            continue
        m = measured.get(r.name, {})
        got = m.get("gpu_bytes")
        row = {"replica": r.name, "planned_bytes": r.planned_bytes, "measured_bytes": got,
               "ratio": round(got / r.planned_bytes, 4) if got else None,
               "within_5pct": bool(got) and abs(got / r.planned_bytes - 1) <= TOLERANCE,
               "under_budget": bool(got) and got <= r.planned_bytes}
        if r.kind == "chat":
            facts = plan.engines[r.name]
            log = m.get("vllm_log", {})
            row |= {"kv_tokens_planned": facts.vllm_kv_tokens, "kv_tokens_vllm": log.get("kv_tokens"),
                    "kv_tokens_exact": log.get("kv_tokens") == facts.vllm_kv_tokens,
                    "weights_planned_gib": round((facts.weight_bytes + facts.drafter_weight_bytes) / GIB, 2),
                    "weights_vllm_gib": log.get("weights_gib"), "block_planned": facts.block_size,
                    "block_vllm": log.get("attention_block_tokens"),
                    "utilization": r.vllm.gpu_memory_utilization,
                    "free_before_start_gib": round((m.get("free_before_start_bytes") or 0) / GIB, 2)}
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| replica | planned GiB | measured GiB (nvidia-smi) | ratio | within ±5% | under budget | "
             "KV tokens plan / vLLM | weights GiB plan / vLLM |", "|---|---:|---:|---:|---|---|---|---|"]
    for r in rows:
        kv = f"{r['kv_tokens_planned']:,} / {r['kv_tokens_vllm'] or '-'}" if "kv_tokens_planned" in r else ""
        w = f"{r['weights_planned_gib']} / {r['weights_vllm_gib']}" if "weights_planned_gib" in r else ""
        got = r["measured_bytes"]
        lines.append(f"| {r['replica']} | {r['planned_bytes'] / GIB:.2f} | {got / GIB if got else 0:.2f} | "
                     f"{r['ratio']} | {r['within_5pct']} | {r['under_budget']} | {kv} | {w} |")
    return "\n".join(lines)


def wait_gpu_empty(sampler: GpuSampler, baseline_used: int, timeout_s: float = 90) -> dict:
    deadline = time.monotonic() + timeout_s
    sample = sampler.read()
    while time.monotonic() < deadline and (sample.processes or sample.used > baseline_used + 64 * 2**20):
        time.sleep(1)
        sample = sampler.read()
    return {"used_bytes": sample.used, "baseline_used_bytes": baseline_used, "processes": sample.processes,
            "empty": not sample.processes and sample.used <= baseline_used + 64 * 2**20}


def run(profile_path: Path, out: Path, timeout_s: float, do_squeeze: bool, do_ingest: bool) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="gpu-plan-"))
    logging_config = workdir / "vllm-logging.json"
    logging_config.write_text(json.dumps(VLLM_LOGGING_CONFIG))
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(logging_config)
    os.environ.setdefault("POOLSERVE_ADMIN_KEY", secrets.token_urlsafe(24))
    profile = load_profile(profile_path)
    plan = build_plan(profile)
    report: dict = {"profile": str(profile_path), "plan": json.loads(plan.model_dump_json()), "steps": []}
    with GpuSampler() as sampler:
        baseline = sampler.read()
        report["gpu_total_bytes"], report["baseline_used_bytes"] = sampler.total(), baseline.used
        started = time.time()
        try:
            with poolserve_stack(profile_path, workdir, timeout_s=timeout_s) as server:
                report["start_to_healthy_s"] = round(time.time() - started, 1)
                import httpx

                # Measured first, at rest: what the plan promises is the footprint once started.
                status = httpx.get(f"{server.base_url}/status", timeout=60,
                                   headers={"Authorization": f"Bearer {os.environ['POOLSERVE_ADMIN_KEY']}"})
                report["status"] = status.json() if status.status_code == 200 else {"http": status.status_code}
                logs = vllm_logs_by_pid(StackLayout(workdir / "state").ray_temp_dir)
                report["vllm_logs"] = {str(k): v for k, v in logs.items()}
                report["measured"] = measured_by_replica(plan, sampler, sampler.first_seen(), logs)
                report["nvidia_smi"] = subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout
                report["rows"] = compare(plan, report["measured"])
                steps = {"answers": lambda: use_the_stack(server.base_url, server.api_key, profile)}
                if do_ingest:
                    steps["ingest"] = lambda: ingest_ratio(server.base_url, server.api_key, profile)
                if do_squeeze:
                    steps["squeeze"] = lambda: squeeze(server.base_url, server.api_key, profile, sampler)
                for name, step in steps.items():  # one failing step does not cost the others
                    try:
                        report[name] = step()
                    except Exception as exc:
                        report[name] = {"error": f"{type(exc).__name__}: {exc}"}
                report["measured_after_use"] = measured_by_replica(plan, sampler, sampler.first_seen(), logs)
        except Exception as exc:  # a failed start is a result too: keep what was seen
            report["error"] = f"{type(exc).__name__}: {exc}"
            report["serve_log_tail"] = (workdir / "serve.log").read_text(errors="replace")[-6000:] \
                if (workdir / "serve.log").exists() else ""
        report["after_down"] = wait_gpu_empty(sampler, baseline.used)
        report["series"] = [{"t": round(s.t - started, 1), "used_gib": round(s.used / GIB, 2),
                             "processes": {str(p): round(b / GIB, 2) for p, b in s.processes.items()}}
                            for s in sampler.samples]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"gpu-plan-{profile.name}.json").write_text(json.dumps(report, indent=1, default=str))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, default=Path("configs/gh200.yaml"))
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--timeout", type=float, default=480, help="seconds for the stack to become healthy")
    parser.add_argument("--squeeze", action="store_true", help="squeeze the GPU until the pool guard sheds")
    parser.add_argument("--ingest", action="store_true", help="ingest through the stack against raw ST")
    args = parser.parse_args()
    report = run(args.profile, args.out, args.timeout, args.squeeze, args.ingest)
    print(json.dumps({k: report.get(k) for k in ("start_to_healthy_s", "answers", "error", "after_down",
                                                  "ingest", "squeeze")}, indent=1, default=str))
    if report.get("rows"):
        print(table(report["rows"]))


if __name__ == "__main__":
    main()
