"""What the stack costs over raw vLLM: the same chat load through poolserve's gateway and through
vLLM's own OpenAI server, with the same engine arguments and environment (the profile's plan).

The load is vLLM's own serving benchmark (vllm.benchmarks.serve, bench/harness/serving.py): streamed
chat completions of random-token prompts, greedy, exactly --output-len tokens each (ignore_eos), at most
`concurrency` in flight, one untimed warm-up request per level. Reported per concurrency: output tokens/s,
TTFT, inter-token latency and request latency percentiles, and poolserve's ratio against raw vLLM.
The stack first, then raw vLLM; never both at once.

    flock /tmp/poolserve-heavy.lock .venv/bin/python bench/bench_gateway.py

Writes bench/results/serving.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.harness.engine import DEFAULT_PROFILE, engine_setup  # noqa: E402
from bench.harness.procs import RunningServer, raw_vllm_server  # noqa: E402
from bench.harness.results import RESULTS_DIR, BenchResult, new_result, write_result  # noqa: E402
from bench.harness.serving import ServingLoad, run_serving_load  # noqa: E402
from bench.harness.stack import poolserve_stack, private_profile_path  # noqa: E402

NAME = "serving"
STACK, RAW = "poolserve", "raw vllm"


def measure(server: RunningServer, label: str, setup, loads: list[ServingLoad], workdir: Path) -> list[dict]:
    rows = []
    for load in loads:
        print(f"[bench] {label}: {load.num_prompts} prompts at concurrency {load.concurrency}", flush=True)
        metrics = run_serving_load(server.base_url, setup.served_model_name, setup.model, load,
                                   workdir / "load.log", server.api_key)
        rows.append({"server": label, "concurrency": load.concurrency, "start_s": server.start_s, **metrics})
    return rows


def run(profile: Path, loads: list[ServingLoad], workdir: Path, name: str = NAME) -> BenchResult:
    with poolserve_stack(profile, workdir) as stack:
        print(f"[bench] poolserve healthy in {stack.start_s:.0f}s", flush=True)
        # The raw server gets the plan of the stack's own (private) profile: the same engine.
        setup = engine_setup(private_profile_path(workdir))
        rows = measure(stack, STACK, setup, loads, workdir)
    with raw_vllm_server(setup, workdir) as raw:
        print(f"[bench] raw vLLM healthy in {raw.start_s:.0f}s", flush=True)
        rows += measure(raw, RAW, setup, loads, workdir)
    by = {(r["server"], r["concurrency"]): r for r in rows}
    metrics = {f"tok_s_ratio_c{load.concurrency}": by[(STACK, load.concurrency)]["output_throughput"]
               / by[(RAW, load.concurrency)]["output_throughput"] for load in loads}
    metrics.update({"poolserve_start_s": by[(STACK, loads[0].concurrency)]["start_s"],
                    "raw_vllm_start_s": by[(RAW, loads[0].concurrency)]["start_s"]})
    config = {"profile": str(profile), "engine": setup.describe(), "loads": [load.describe() for load in loads],
              "load_generator": "vllm.benchmarks.serve (openai-chat, random dataset)"}
    return new_result(name, config, metrics, rows)


def tables(result: BenchResult) -> str:
    by = {(r["server"], r["concurrency"]): r for r in result.rows}
    levels = sorted({r["concurrency"] for r in result.rows})
    load = result.config["loads"][0]
    lines = [f"{load['num_prompts']} streamed chat requests per row, random prompts of {load['input_len']} tokens, "
             f"{load['output_len']} output tokens each, greedy (vllm.benchmarks.serve)", "",
             "| concurrency | raw vLLM tok/s | poolserve tok/s | ratio | raw TTFT p50 ms | poolserve TTFT p50 ms "
             "| raw latency p50 s | poolserve latency p50 s |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in levels:
        r, p = by[(RAW, c)], by[(STACK, c)]
        lines.append(f"| {c} | {r['output_throughput']:.1f} | {p['output_throughput']:.1f} | "
                     f"{p['output_throughput'] / r['output_throughput']:.2f}x | {r['median_ttft_ms']:.0f} | "
                     f"{p['median_ttft_ms']:.0f} | {r['median_e2el_ms'] / 1000:.2f} | {p['median_e2el_ms'] / 1000:.2f} |")
    lines += ["", "| concurrency | server | TTFT p99 ms | ITL p50 ms | ITL p99 ms | TPOT p50 ms | start to healthy s |",
              "|---:|---|---:|---:|---:|---:|---:|"]
    for c in levels:
        for server in (RAW, STACK):
            x = by[(server, c)]
            lines.append(f"| {c} | {server} | {x['p99_ttft_ms']:.0f} | {x['median_itl_ms']:.1f} | {x['p99_itl_ms']:.1f} | "
                         f"{x['median_tpot_ms']:.1f} | {x['start_s']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--prompts", type=int, default=16, help="timed requests per concurrency level")
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 8])
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    loads = [ServingLoad(args.prompts, c, args.input_len, args.output_len) for c in args.concurrency]
    workdir = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    result = run(args.profile, loads, workdir)
    print(tables(result))
    print(f"wrote {write_result(result, args.out_dir)} (logs in {workdir})")


if __name__ == "__main__":
    main()
