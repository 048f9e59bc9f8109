"""What the stack costs over raw vLLM: the same chat load through poolserve's gateway and through
vLLM's own OpenAI server, with the same engine arguments and environment (the profile's plan).

The load is vLLM's own serving benchmark (vllm.benchmarks.serve, bench/harness/serving.py): streamed
chat completions of random-token prompts, greedy, exactly --output-len tokens each (ignore_eos), at most
`concurrency` in flight, one untimed warm-up request per level. Reported per concurrency: output tokens/s,
TTFT, inter-token latency and request latency percentiles, and poolserve's ratio against raw vLLM.
Random-token prompts and RAG prompts (bench/harness/prompts.py). The CPU seconds each process of either
server used per 1000 output tokens are recorded beside (bench/harness/cpu_accounting.py): where the
stack's extra time goes. After the loads, sequential streams time one stream's first token on each server, and
the gateway's Server-Timing header splits the stack's extra TTFT (bench/harness/first_token.py). The stack
first, then raw vLLM; never both at once.

    flock /tmp/poolserve-heavy.lock .venv/bin/python bench/bench_gateway.py

Writes bench/results/serving.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.harness.cpu_accounting import CpuAccount  # noqa: E402
from bench.harness.engine import DEFAULT_PROFILE, engine_setup  # noqa: E402
from bench.harness.first_token import first_token_times, probe_prompts, split_against_raw, summarise  # noqa: E402
from bench.harness.llama_cpp import BF16_GGUF, llama_cpp_unavailable, llama_server  # noqa: E402
from bench.harness.procs import RunningServer, raw_vllm_server  # noqa: E402
from bench.harness.results import RESULTS_DIR, BenchResult, new_result, write_result  # noqa: E402
from bench.harness.serving import ServingLoad, run_serving_load  # noqa: E402
from bench.harness.spec_metrics import SpecCounters, read_counters, settled_counters  # noqa: E402
from bench.harness.stack import poolserve_stack, private_profile_path  # noqa: E402

NAME = "serving"
STACK, RAW, LLAMA = "poolserve", "raw vllm", "llama.cpp"
CPU_ROLES_SHOWN = 6  # the busiest roles per server in the CPU table
FIRST_TOKEN_PROBES = 17  # sequential streams after the loads, the first a warm-up: where one stream's TTFT goes


def _dataset(row: dict) -> str:
    return row.get("dataset", "random")  # results written before RAG prompts had only random ones


def measure(server: RunningServer, label: str, setup, loads: list[ServingLoad], workdir: Path) -> list[dict]:
    """One serving run per load, with the CPU seconds each of the server's processes used during it."""
    rows = []
    for load in loads:
        print(
            f"[bench] {label}: {load.num_prompts} {load.dataset} prompts at concurrency {load.concurrency}", flush=True
        )
        speculates = setup.args.speculative_config is not None and label != LLAMA
        before = read_counters(server.metrics_url) if speculates else None
        with CpuAccount(server.pids) as account:
            metrics = run_serving_load(
                server.base_url,
                setup.served_model_name,
                setup.model,
                load,
                workdir / "load.log",
                server.api_key,
                connection_per_request=label == LLAMA,
            )
        per_1k = 1000 / max(1, metrics["total_output_tokens"])
        cpu = {role: round(seconds * per_1k, 3) for role, seconds in account.by_role().items() if seconds > 0.01}
        after = settled_counters(server.metrics_url, before) if speculates else None
        # The warm-up request is inside the counters' window too: one request of num_prompts + 1.
        spec = after.minus(before or SpecCounters()).stats() if after else None
        rows.append(
            {
                "server": label,
                "dataset": load.dataset,
                "concurrency": load.concurrency,
                "start_s": server.start_s,
                "cpu_s_per_1k_tokens": cpu,
                "speculation": spec,
                **metrics,
            }
        )
    return rows


def first_token_probe(server: RunningServer, setup, probes: int) -> dict:
    """One stream at a time, after the loads: the client's TTFT and, through the stack, its Server-Timing parts."""
    print(f"[bench] {probes} sequential streams for the first token's parts", flush=True)
    prompts = probe_prompts(probes)
    return summarise(first_token_times(server.base_url, server.api_key, setup.served_model_name, prompts))


def ratios(rows: list[dict]) -> dict[str, float]:
    """poolserve/raw output tokens/s and the TTFT p50 difference, per dataset and concurrency."""
    by = {(r["server"], _dataset(r), r["concurrency"]): r for r in rows}
    metrics = {}
    for (server, dataset, c), row in sorted(by.items()):
        raw = by.get((RAW, dataset, c))
        if server == STACK and raw:
            metrics[f"tok_s_ratio_{dataset}_c{c}"] = row["output_throughput"] / raw["output_throughput"]
            metrics[f"ttft_p50_delta_ms_{dataset}_c{c}"] = row["median_ttft_ms"] - raw["median_ttft_ms"]
    return metrics


def run(
    profile: Path,
    loads: list[ServingLoad],
    workdir: Path,
    name: str = NAME,
    chat_overrides: dict | None = None,
    gateway_overrides: dict | None = None,
    raw: bool = True,
    llama: bool = False,
    running: RunningServer | None = None,
    first_token_probes: int = FIRST_TOKEN_PROBES,
) -> BenchResult:
    """The loads through a private stack, then (the stack stopped) through raw vLLM with the same plan
    (raw=False: the stack only), then through llama.cpp's server on the same weights (llama=True, when built).
    `running`: a stack already up (from `profile`, unchanged) is measured instead of a private one, and stays
    up, idle, while raw vLLM runs: for the test suite's harness check, not for figures."""
    first_token: dict[str, dict] = {}
    if running is not None:
        setup = engine_setup(profile)
        rows = measure(running, STACK, setup, loads, workdir)
        first_token[STACK] = first_token_probe(running, setup, first_token_probes)
    else:
        with poolserve_stack(
            profile, workdir, chat_overrides=chat_overrides, gateway_overrides=gateway_overrides
        ) as stack:
            print(f"[bench] poolserve healthy in {stack.start_s:.0f}s", flush=True)
            # The raw server gets the plan of the stack's own (private) profile: the same engine.
            setup = engine_setup(private_profile_path(workdir))
            rows = measure(stack, STACK, setup, loads, workdir)
            first_token[STACK] = first_token_probe(stack, setup, first_token_probes)
    if raw:
        with raw_vllm_server(setup, workdir) as server:
            print(f"[bench] raw vLLM healthy in {server.start_s:.0f}s", flush=True)
            rows += measure(server, RAW, setup, loads, workdir)
            first_token[RAW] = first_token_probe(server, setup, first_token_probes)
    if STACK in first_token and RAW in first_token:
        first_token["stack_against_raw"] = split_against_raw(first_token[STACK], first_token[RAW])
    skipped = llama_cpp_unavailable() if llama else "llama.cpp not asked for"
    if llama and skipped is None:
        slots = max(load.concurrency for load in loads)
        try:  # optional: a failure is reported in the result, and the other servers' rows are kept
            with llama_server(BF16_GGUF, workdir, setup.served_model_name, slots) as server:
                print(f"[bench] llama.cpp healthy in {server.start_s:.0f}s", flush=True)
                rows += measure(server, LLAMA, setup, loads, workdir)
        except (RuntimeError, OSError) as exc:
            skipped = f"llama.cpp failed: {exc}"
            print(f"[bench] {skipped}", flush=True)
    elif llama:
        print(f"[bench] {skipped}", flush=True)
    metrics = {
        **ratios(rows),
        "poolserve_start_s": rows[0]["start_s"],
        "raw_vllm_start_s": rows[-1]["start_s"],
        "first_token": first_token,
    }
    config = {
        "profile": str(profile),
        "stack": "already running" if running else "private",
        "engine": setup.describe(),
        "loads": [load.describe() for load in loads],
        "chat_overrides": chat_overrides or {},
        "gateway_overrides": gateway_overrides or {},
        "llama_cpp": "llama-server (llama.cpp vendored by llama-cpp-python 0.3.36), bf16 GGUF of the same "
        "weights, one slot per stream"
        if llama and skipped is None
        else skipped,
        "load_generator": "vllm.benchmarks.serve (openai-chat; random dataset, or RAG prompts as custom)",
    }
    return new_result(name, config, metrics, rows)


def _load_line(result: BenchResult, dataset: str) -> str:
    load = next((x for x in result.config["loads"] if x.get("dataset", "random") == dataset), result.config["loads"][0])
    if dataset == "rag":
        return (
            f"{load['num_prompts']} streamed chat requests per row, RAG prompts (a question and three numbered "
            f"passages from the pydoc corpus), answered until the model stops or {load['output_len']} tokens, "
            "greedy (vllm.benchmarks.serve)"
        )
    return (
        f"{load['num_prompts']} streamed chat requests per row, random prompts of {load['input_len']} tokens, "
        f"{load['output_len']} output tokens each, greedy (vllm.benchmarks.serve)"
    )


def _throughput_table(by: dict, dataset: str, levels: list[int]) -> list[str]:
    llama = any((LLAMA, dataset, c) in by for c in levels)
    lines = [
        "| concurrency | raw vLLM tok/s | poolserve tok/s | ratio | raw TTFT p50 ms | poolserve TTFT p50 ms "
        "| TTFT +ms | raw latency p50 s | poolserve latency p50 s |"
        + (" llama.cpp tok/s | llama.cpp TTFT p50 ms |" if llama else ""),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if llama else ""),
    ]
    for c in levels:
        r, p = by[(RAW, dataset, c)], by[(STACK, dataset, c)]
        line = (
            f"| {c} | {r['output_throughput']:.1f} | {p['output_throughput']:.1f} | "
            f"{p['output_throughput'] / r['output_throughput']:.2f}x | {r['median_ttft_ms']:.0f} | "
            f"{p['median_ttft_ms']:.0f} | {p['median_ttft_ms'] - r['median_ttft_ms']:+.0f} | "
            f"{r['median_e2el_ms'] / 1000:.2f} | {p['median_e2el_ms'] / 1000:.2f} |"
        )
        if llama:
            x = by.get((LLAMA, dataset, c))
            line += f" {x['output_throughput']:.1f} | {x['median_ttft_ms']:.0f} |" if x else " - | - |"
        lines.append(line)
    return lines


def _latency_table(by: dict, dataset: str, levels: list[int]) -> list[str]:
    lines = [
        "| concurrency | server | TTFT p95 ms | ITL p50 ms | ITL p95 ms | TPOT p50 ms | TPOT p95 ms "
        "| output tokens | start to healthy s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in levels:
        for server in (RAW, STACK, LLAMA):
            if (server, dataset, c) not in by:
                continue
            x = by[(server, dataset, c)]
            p95 = x.get("p95_ttft_ms", x.get("p99_ttft_ms"))
            lines.append(
                f"| {c} | {server} | {p95:.0f} | {x['median_itl_ms']:.1f} | "
                f"{x.get('p95_itl_ms', x.get('p99_itl_ms')):.1f} | {x['median_tpot_ms']:.1f} | "
                f"{x.get('p95_tpot_ms', x.get('p99_tpot_ms')):.1f} | {x['total_output_tokens']} | "
                f"{x['start_s']:.0f} |"
            )
    return lines


def _cpu_table(by: dict, dataset: str, level: int) -> list[str]:
    if "cpu_s_per_1k_tokens" not in by[(STACK, dataset, level)]:
        return []
    lines = [
        f"CPU seconds per 1000 output tokens at concurrency {level}, by process:",
        "",
        "| server | process | CPU s / 1k tokens |",
        "|---|---|---:|",
    ]
    for server in (RAW, STACK, LLAMA):
        if (server, dataset, level) not in by:
            continue
        cpu = by[(server, dataset, level)]["cpu_s_per_1k_tokens"]
        for role, seconds in list(cpu.items())[:CPU_ROLES_SHOWN]:
            lines.append(f"| {server} | {role} | {seconds:.2f} |")
        lines.append(f"| {server} | **all** | **{sum(cpu.values()):.2f}** |")
    return lines


def tables(result: BenchResult) -> str:
    by = {(r["server"], _dataset(r), r["concurrency"]): r for r in result.rows}
    lines: list[str] = []
    for dataset in sorted({_dataset(r) for r in result.rows}, key=lambda d: d != "random"):
        levels = sorted({c for (_, d, c) in by if d == dataset})
        if lines:
            lines.append("")
        lines += [
            _load_line(result, dataset),
            "",
            *_throughput_table(by, dataset, levels),
            "",
            *_latency_table(by, dataset, levels),
        ]
        cpu = _cpu_table(by, dataset, levels[-1])
        lines += ["", *cpu] if cpu else []
    first = _first_token_table(result.metrics.get("first_token") or {})
    lines += ["", *first] if first else []
    return "\n".join(lines)


def _first_token_table(first_token: dict) -> list[str]:
    split = first_token.get("stack_against_raw")
    if not split:
        return []
    stack, raw = first_token[STACK], first_token[RAW]
    parts = ", ".join(f"{name} {ms:.1f}" for name, ms in stack["server_timing_ms_p50"].items())
    return [
        f"One stream's first token, {stack['n']} sequential streams each (p50, ms; the gateway's Server-Timing):",
        "",
        "| raw vLLM TTFT | poolserve TTFT | extra | in the gateway | the chat replica beyond raw's TTFT "
        "| HTTP and proxy | the gateway's parts |",
        "|---:|---:|---:|---:|---:|---:|---|",
        f"| {raw['ttft_ms_p50']:.1f} | {stack['ttft_ms_p50']:.1f} | {split['extra_ms']:+.1f} | "
        f"{split['gateway_ms']:.1f} | {split['engine_beyond_raw_ms']:+.1f} | {split['http_and_proxy_ms']:.1f} | {parts} |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--prompts", type=int, default=16, help="timed requests per concurrency level")
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8, 16])
    parser.add_argument("--datasets", type=lambda s: s.split(","), default=["random", "rag"])
    parser.add_argument("--input-len", type=int, default=256, help="random prompts' length in tokens")
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--name", default=NAME, help="the result's name (bench/results/NAME.json)")
    parser.add_argument(
        "--gateway",
        action="append",
        default=[],
        metavar="FIELD=JSON",
        help="override a gateway field of the profile, e.g. direct_ingress=true",
    )
    parser.add_argument(
        "--chat",
        action="append",
        default=[],
        metavar="FIELD=JSON",
        help="override a chat field of the profile, e.g. stream_batching_interval_ms=0",
    )
    parser.add_argument("--no-raw", action="store_true", help="measure the stack only")
    parser.add_argument(
        "--llama-cpp",
        action="store_true",
        help="also llama.cpp's server on the same weights (skipped with a message when not built)",
    )
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    loads = [
        ServingLoad(max(args.prompts, 2 * c), c, args.input_len, args.output_len, dataset=dataset)
        for dataset in args.datasets
        for c in args.concurrency
    ]
    workdir = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    gateway = {key: json.loads(value) for key, value in (item.split("=", 1) for item in args.gateway)}
    chat = {key: json.loads(value) for key, value in (item.split("=", 1) for item in args.chat)}
    result = run(
        args.profile,
        loads,
        workdir,
        args.name,
        chat_overrides=chat or None,
        gateway_overrides=gateway or None,
        raw=not args.no_raw,
        llama=args.llama_cpp,
    )
    print(tables(result))
    print(f"wrote {write_result(result, args.out_dir)} (logs in {workdir})")


if __name__ == "__main__":
    main()
