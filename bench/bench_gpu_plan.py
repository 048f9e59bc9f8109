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

from bench.gpu_probe import (
    GIB,
    VLLM_LOGGING_CONFIG,
    GpuSampler,
    decode_roofline,
    role_of,  # noqa: E402
    vllm_logs_by_pid,
)
from bench.gpu_squeeze import ingest_ratio, squeeze  # noqa: E402
from bench.harness.stack import poolserve_stack  # noqa: E402
from planner.plan import build_plan  # noqa: E402
from planner.profile import load_profile  # noqa: E402
from stackctl.launcher import StackLayout  # noqa: E402

TOLERANCE = 0.05  # each replica's GPU bytes within +-5% of its plan (issue's goal)
DOC = (
    "The H200 has 141 GB of HBM3e. Its memory bandwidth is 4.8 TB/s. poolserve plans every byte of it: "
    "weights, KV cache, recurrent state, activations and CUDA contexts, before anything starts."
)


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


REAL_DOCUMENTS = (
    Path(__file__).resolve().parents[1] / "tests" / "data" / "shared-mime-info-spec.pdf",
    Path(__file__).resolve().parents[1] / "tests" / "data" / "rsyslog-omusrmsg.html",
)
RAG_QUESTION = "What does the omusrmsg output module do?"  # answered by the rsyslog page


def _chat_steps(client, profile) -> dict:
    steps: dict = {}
    for _, engine in profile.chat_engines():
        steps[f"chat {engine.model_id}"] = lambda m=engine.model_id: _chat_once(client, m)
    steps["chat streamed"] = lambda: _chat_streamed(client, profile.chat.model_id)
    return steps


def _chat_once(client, model: str) -> dict:
    reply = client.chat.completions.create(
        model=model, max_tokens=16, temperature=0, messages=[{"role": "user", "content": "Say OK."}]
    )
    return {"finish_reason": reply.choices[0].finish_reason, "completion_tokens": reply.usage.completion_tokens}


def _chat_streamed(client, model: str) -> dict:
    chunks, usage, finish = 0, None, None
    for chunk in client.chat.completions.create(
        model=model,
        max_tokens=32,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Count to ten."}],
    ):
        chunks += 1
        usage = chunk.usage or usage
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    return {"chunks": chunks, "finish_reason": finish, "completion_tokens": usage.completion_tokens if usage else None}


def _upload(base_url: str, headers: dict, path: Path) -> dict:
    import httpx

    with path.open("rb") as handle:
        reply = httpx.post(
            f"{base_url}/v1/collections/gpu/documents",
            headers=headers,
            timeout=300,
            files={"file": (path.name, handle)},
        )
    body = reply.json()
    if reply.status_code != 200:
        raise RuntimeError(f"{reply.status_code}: {body}")
    return {"status": reply.status_code, "chunks": sum(int(d.get("chunks", 0)) for d in body.get("documents", []))}


def use_the_stack(base_url: str, key: str, profile) -> dict:
    """Every kind of request through the real openai client (and httpx for uploads), each step's outcome
    recorded on its own: a failed step never hides the others'."""
    import httpx
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key=key, timeout=300)
    headers = {"Authorization": f"Bearer {key}"}

    def embeddings() -> dict:
        emb = client.embeddings.create(model=profile.embedder.model_id, input=["GPU memory", "a second input"])
        return {"vectors": len(emb.data), "dimension": len(emb.data[0].embedding)}

    def ingest_text() -> dict:
        reply = httpx.post(
            f"{base_url}/v1/collections/gpu/documents",
            headers=headers,
            timeout=300,
            json={"documents": [{"id": "h200", "text": DOC, "metadata": {"source": "gpu"}}]},
        )
        reply.raise_for_status()
        return {"status": reply.status_code}

    def rag() -> dict:
        reply = httpx.post(
            f"{base_url}/v1/rag/query",
            headers=headers,
            timeout=300,
            json={"collection": "gpu", "question": RAG_QUESTION, "max_tokens": 16, "min_score": -1},
        )
        body = reply.json()
        if reply.status_code != 200:
            raise RuntimeError(f"{reply.status_code}: {body}")
        return {
            "status": reply.status_code,
            "citations": len(body.get("citations") or []),
            "cited": [c.get("document_id") for c in body.get("citations") or []],
        }

    def chat_rag() -> dict:
        reply = client.chat.completions.create(
            model=profile.chat.model_id,
            max_tokens=8,
            temperature=0,
            messages=[{"role": "user", "content": RAG_QUESTION}],
            extra_body={"rag": {"collection": "gpu", "min_score": -1}},
        )
        return {"citations": len((reply.model_extra or {}).get("citations") or [])}

    steps = {
        **_chat_steps(client, profile),
        "embeddings": embeddings,
        "ingest text": ingest_text,
        **{f"ingest {p.suffix[1:]}": (lambda p=p: _upload(base_url, headers, p)) for p in REAL_DOCUMENTS},
        "rag query": rag,
        "chat with rag": chat_rag,
    }
    return run_steps(steps)


def run_steps(steps: dict) -> dict:
    """Each step's result, or its error, under its own name."""
    out: dict = {}
    for name, step in steps.items():
        started = time.perf_counter()
        try:
            out[name] = {"ok": True, **step()}
        except Exception as exc:
            out[name] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:500]}"}
        out[name]["seconds"] = round(time.perf_counter() - started, 3)
    return out


def engine_log(worker_pid: int, logs: dict[int, dict]) -> dict:
    """The worker's memory lines plus its EngineCore's: vLLM 0.26 logs "GPU KV cache size" in the EngineCore
    process, the weights and graphs in the worker. The EngineCore is the other process whose log has the same
    weights and attention block (engines of one stack differ in one or the other)."""
    own = dict(logs.get(worker_pid, {}))
    for pid, lines in logs.items():
        if pid != worker_pid and all(lines.get(k) == own.get(k) for k in ("weights_gib", "attention_block_tokens")):
            own.update({k: v for k, v in lines.items() if k not in own})
    return own


def measured_by_replica(plan, sampler: GpuSampler, seen: dict, logs: dict) -> dict[str, dict]:
    """Each GPU process, by the replica it belongs to: vLLM workers in the order they appeared (engines
    start one at a time, in the plan's order), the embedder by its title."""
    now = sampler.read()
    engines = [r.name for r in sorted(plan.replicas, key=lambda r: r.start_order) if r.kind == "chat"]
    workers = sorted(
        (pid for pid in now.processes if role_of(_title(pid)) == "vllm_worker"),
        key=lambda pid: seen[pid].t if pid in seen else 0,
    )
    result: dict[str, dict] = {}
    for name, pid in zip(engines, workers):
        result[name] = {
            "pid": pid,
            "gpu_bytes": now.processes[pid],
            "vllm_log": engine_log(pid, logs),
            "free_before_start_bytes": seen[pid].free if pid in seen else None,
        }
    others = {pid: b for pid, b in now.processes.items() if pid not in workers}
    for pid, nbytes in others.items():
        role = role_of(_title(pid))
        entry = result.setdefault(role if role != "other" else f"pid {pid}", {"pid": pid, "gpu_bytes": 0})
        entry["gpu_bytes"] += nbytes
    result["_device"] = {"used_bytes": now.used, "free_bytes": now.free}
    return result


def peaks_by_replica(measured: dict, samples: list, since: float) -> dict[str, int]:
    """Each measured replica's largest NVML bytes in the samples taken since `since` (its use included)."""
    return {
        name: max([s.processes.get(m["pid"], 0) for s in samples if s.t >= since] or [0])
        for name, m in measured.items()
        if isinstance(m, dict) and "pid" in m
    }


def compare(plan, measured: dict, peaks: dict[str, int] | None = None) -> list[dict]:
    """Each replica at rest against its resident plan (planned_bytes - growth_bytes: the activations it
    releases after a batch), within +-5%; at rest and at its peak in use under its budget (planned_bytes)."""
    rows = []
    for r in plan.replicas:
        if not r.planned_bytes:
            continue
        m = measured.get(r.name, {})
        got = m.get("gpu_bytes")
        resident = r.planned_bytes - r.growth_bytes
        row = {
            "replica": r.name,
            "planned_bytes": r.planned_bytes,
            "planned_at_rest_bytes": resident,
            "measured_bytes": got,
            "ratio": round(got / resident, 4) if got else None,
            "within_5pct": bool(got) and abs(got / resident - 1) <= TOLERANCE,
            "under_budget": bool(got) and got <= r.planned_bytes,
        }
        peak = (peaks or {}).get(r.name)
        if peak:
            row |= {
                "peak_bytes": peak,
                "peak_of_budget": round(peak / r.planned_bytes, 4),
                "peak_under_budget": peak <= r.planned_bytes,
            }
        if r.kind == "chat":
            facts = plan.engines[r.name]
            log = m.get("vllm_log", {})
            row |= {
                "kv_tokens_planned": facts.vllm_kv_tokens,
                "kv_tokens_vllm": log.get("kv_tokens"),
                "kv_tokens_exact": log.get("kv_tokens") == facts.vllm_kv_tokens,
                "weights_planned_gib": round((facts.weight_bytes + facts.drafter_weight_bytes) / GIB, 2),
                "weights_vllm_gib": log.get("weights_gib"),
                "block_planned": facts.block_size,
                "block_vllm": log.get("attention_block_tokens"),
                "utilization": r.vllm.gpu_memory_utilization,
                "free_before_start_gib": round((m.get("free_before_start_bytes") or 0) / GIB, 2),
            }
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| replica | planned GiB (at rest) | measured GiB at rest | ratio | within ±5% | peak in use GiB "
        "(of budget) | under budget | KV tokens plan / vLLM | weights GiB plan / vLLM |",
        "|---|---:|---:|---:|---|---:|---|---|---|",
    ]
    for r in rows:
        kv = f"{r['kv_tokens_planned']:,} / {r['kv_tokens_vllm'] or '-'}" if "kv_tokens_planned" in r else ""
        w = f"{r['weights_planned_gib']} / {r['weights_vllm_gib']}" if "weights_planned_gib" in r else ""
        got = r["measured_bytes"]
        peak = f"{r['peak_bytes'] / GIB:.2f} ({r['peak_of_budget']})" if r.get("peak_bytes") else "-"
        under = r["under_budget"] and r.get("peak_under_budget", True)
        lines.append(
            f"| {r['replica']} | {r['planned_bytes'] / GIB:.2f} ({r['planned_at_rest_bytes'] / GIB:.2f}) | "
            f"{got / GIB if got else 0:.2f} | {r['ratio']} | {r['within_5pct']} | {peak} | {under} | {kv} | {w} |"
        )
    return "\n".join(lines)


def wait_gpu_empty(sampler: GpuSampler, baseline_used: int, timeout_s: float = 90) -> dict:
    deadline = time.monotonic() + timeout_s
    sample = sampler.read()
    while time.monotonic() < deadline and (sample.processes or sample.used > baseline_used + 64 * 2**20):
        time.sleep(1)
        sample = sampler.read()
    return {
        "used_bytes": sample.used,
        "baseline_used_bytes": baseline_used,
        "processes": sample.processes,
        "empty": not sample.processes and sample.used <= baseline_used + 64 * 2**20,
    }


def single_stream_decode(
    base_url: str, key: str, model: str, weight_bytes: int, device_name: str, tokens: int = 256
) -> dict:
    """One stream of `tokens` output tokens (ignore_eos) through the gateway, after a warm-up: decode tokens/s
    from the first streamed chunk to the last (the usage's token count: with dummy weights most sampled ids
    decode to no text, so chunks undercount tokens), against the card's HBM roofline for the target weights."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"}
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell a long story."}],
        "temperature": 0,
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    httpx.post(
        f"{base_url}/v1/chat/completions",
        headers=headers,
        timeout=300,
        json={**body, "stream": False, "stream_options": None, "max_tokens": 16},
    ).raise_for_status()
    started, first, usage = time.perf_counter(), None, None
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", headers=headers, json=body, timeout=300) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            if first is None and chunk.get("choices"):
                first = time.perf_counter()
            usage = chunk.get("usage") or usage
    ended = time.perf_counter()
    produced = int((usage or {}).get("completion_tokens") or 0)
    tok_s = (produced - 1) / (ended - first) if first and produced > 1 and ended > first else None
    roofline = decode_roofline(weight_bytes, device_name)
    return {
        "device": device_name,
        "completion_tokens": produced,
        "ttft_s": round(first - started, 4) if first else None,
        "decode_tok_s": round(tok_s, 1) if tok_s else None,
        "weight_bytes": weight_bytes,
        "roofline_tok_s": round(roofline, 1) if roofline else None,
        "of_roofline": round(tok_s / roofline, 3) if tok_s and roofline else None,
    }


def boot(
    profile,
    profile_path: Path,
    plan,
    sampler: GpuSampler,
    workdir: Path,
    timeout_s: float,
    use: bool,
    do_squeeze: bool,
    do_ingest: bool,
) -> dict:
    """One cold boot: start, measure at rest, (use: every request kind, decode, ingest, squeeze), stop, and
    check the GPU is back at its baseline."""
    workdir.mkdir(parents=True, exist_ok=True)
    baseline = sampler.read()
    report: dict = {"baseline_used_bytes": baseline.used}
    started = time.time()
    try:
        with poolserve_stack(profile_path, workdir, timeout_s=timeout_s) as server:
            report["start_to_healthy_s"] = round(time.time() - started, 1)
            import httpx

            # Measured first, at rest: what the plan promises is the footprint once started.
            status = httpx.get(
                f"{server.base_url}/status",
                timeout=60,
                headers={"Authorization": f"Bearer {os.environ['POOLSERVE_ADMIN_KEY']}"},
            )
            report["status"] = status.json() if status.status_code == 200 else {"http": status.status_code}
            report["guard_at_rest"] = (report["status"].get("pool") or {}).get("state")
            logs = vllm_logs_by_pid(StackLayout(workdir / "state").ray_temp_dir)
            report["vllm_logs"] = {str(k): v for k, v in logs.items()}
            report["measured"] = measured_by_replica(plan, sampler, sampler.first_seen(), logs)
            report["nvidia_smi"] = subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout
            report["rows"] = compare(plan, report["measured"])
            if use:
                facts = plan.engines["chat"]
                steps = {
                    "answers": lambda: use_the_stack(server.base_url, server.api_key, profile),
                    "decode": lambda: single_stream_decode(
                        server.base_url,
                        server.api_key,
                        profile.chat.model_id,
                        facts.weight_bytes,
                        sampler.device_name(),
                    ),
                }
                if do_ingest:
                    steps["ingest"] = lambda: ingest_ratio(server.base_url, server.api_key, profile)
                if do_squeeze:
                    steps["squeeze"] = lambda: squeeze(
                        server.base_url, server.api_key, profile, sampler, plan.edge.guard.shed_ingest_at
                    )
                for name, step in steps.items():  # one failing step does not cost the others
                    try:
                        report[name] = step()
                    except Exception as exc:
                        report[name] = {"error": f"{type(exc).__name__}: {exc}"}
                report["measured_after_use"] = measured_by_replica(plan, sampler, sampler.first_seen(), logs)
                peaks = peaks_by_replica(report["measured"], sampler.samples, started)
                report["rows_after_use"] = compare(plan, report["measured_after_use"], peaks)
    except Exception as exc:  # a failed start is a result too: keep what was seen
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["serve_log_tail"] = (
            (workdir / "serve.log").read_text(errors="replace")[-6000:] if (workdir / "serve.log").exists() else ""
        )
    report["after_down"] = wait_gpu_empty(sampler, baseline.used)
    return report


def boots_agree(boots: list[dict], tolerance: float = 0.01) -> dict:
    """Whether every boot gave the same KV tokens and each replica's bytes within +-tolerance of the first."""
    first = {r["replica"]: r for r in boots[0].get("rows") or []}
    kv_tokens = [[r.get("kv_tokens_vllm") for r in b.get("rows") or [] if "kv_tokens_vllm" in r] for b in boots]
    spread = {}
    for name, row in first.items():
        values = [next((r["measured_bytes"] for r in b.get("rows") or [] if r["replica"] == name), None) for b in boots]
        known = [v for v in values if v]
        spread[name] = {"bytes": values, "max_over_min": round(max(known) / min(known), 4) if known else None}
    return {
        "boots": len(boots),
        "kv_tokens": kv_tokens,
        "kv_tokens_equal": all(k == kv_tokens[0] for k in kv_tokens),
        "bytes": spread,
        "bytes_within": all(
            s["max_over_min"] is not None and s["max_over_min"] <= 1 + tolerance for s in spread.values()
        ),
    }


def earlier_boots(paths: list[Path]) -> list[dict]:
    """The boots of earlier reports of the same profile (their first boot, then its later ones), so that
    boots measured in separate runs (e.g. on either side of another bench) are compared as one series."""
    boots = []
    for path in paths:
        report = json.loads(Path(path).read_text())
        if report.get("rows"):
            boots.append({"rows": report["rows"], "from": str(path)})
        boots += [{**b, "from": str(path)} for b in report.get("later_boots") or [] if b.get("rows")]
    return boots


def run(
    profile_path: Path,
    out: Path,
    timeout_s: float,
    do_squeeze: bool,
    do_ingest: bool,
    boots: int = 1,
    use: bool = True,
    with_boots: list[Path] | None = None,
) -> dict:
    """Boot the profile `boots` times (the first one used unless use=False) and write the report after each
    boot, so that a run cut short keeps the boots it finished."""
    workdir = Path(tempfile.mkdtemp(prefix="gpu-plan-"))
    logging_config = workdir / "vllm-logging.json"
    logging_config.write_text(json.dumps(VLLM_LOGGING_CONFIG))
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(logging_config)
    os.environ.setdefault("POOLSERVE_ADMIN_KEY", secrets.token_urlsafe(24))
    profile = load_profile(profile_path)
    plan = build_plan(profile)
    report: dict = {"profile": str(profile_path), "plan": json.loads(plan.model_dump_json())}
    earlier = earlier_boots(with_boots or [])
    out.mkdir(parents=True, exist_ok=True)
    result_path = out / f"gpu-plan-{profile.name}{'' if use else '-boots'}.json"
    with GpuSampler() as sampler:
        report["device"], report["gpu_total_bytes"] = sampler.device_name(), sampler.total()
        started = time.time()
        runs = []
        for index in range(boots):  # the first boot is used; the later ones only start, measure and stop
            runs.append(
                boot(
                    profile,
                    profile_path,
                    plan,
                    sampler,
                    workdir / f"boot{index}",
                    timeout_s,
                    use=use and index == 0,
                    do_squeeze=do_squeeze,
                    do_ingest=do_ingest,
                )
            )
            report.update(runs[0])
            report["later_boots"] = runs[1:]
            if len(earlier) + len(runs) > 1:
                report["boots_agree"] = boots_agree(earlier + runs)
                report["boots_agree"]["earlier_from"] = sorted({b["from"] for b in earlier})
            report["series"] = [
                {
                    "t": round(s.t - started, 1),
                    "used_gib": round(s.used / GIB, 2),
                    "processes": {str(p): round(b / GIB, 2) for p, b in s.processes.items()},
                }
                for s in sampler.samples
            ]
            result_path.write_text(json.dumps(report, indent=1, default=str))
            if runs[-1].get("error"):
                break
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, default=Path("configs/gh200.yaml"))
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--timeout", type=float, default=480, help="seconds for the stack to become healthy")
    parser.add_argument("--squeeze", action="store_true", help="squeeze the GPU until the pool guard sheds")
    parser.add_argument("--ingest", action="store_true", help="ingest through the stack against raw ST")
    parser.add_argument("--boots", type=int, default=1, help="cold boots of the same profile (the first is used)")
    parser.add_argument("--no-use", action="store_true", help="every boot only starts, measures at rest and stops")
    parser.add_argument(
        "--with-boots",
        type=Path,
        action="append",
        default=[],
        metavar="REPORT",
        help="an earlier report of the same profile whose boots join the comparison",
    )
    args = parser.parse_args()
    report = run(
        args.profile,
        args.out,
        args.timeout,
        args.squeeze,
        args.ingest,
        args.boots,
        use=not args.no_use,
        with_boots=args.with_boots,
    )
    print(
        json.dumps(
            {
                k: report.get(k)
                for k in (
                    "device",
                    "start_to_healthy_s",
                    "guard_at_rest",
                    "answers",
                    "decode",
                    "error",
                    "after_down",
                    "ingest",
                    "squeeze",
                    "boots_agree",
                )
            },
            indent=1,
            default=str,
        )
    )
    if report.get("rows"):
        print(table(report["rows"]))


if __name__ == "__main__":
    main()
