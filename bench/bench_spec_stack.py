"""Speculative decoding through the served stack: each method the profile offers against none, on RAG
traffic and on open chat, at concurrency 1 and 4, through poolserve's gateway (not an offline engine).

One private stack per method (the profile's chat.speculative replaced, everything else as planned), the
same prompts in the same order for each (bench/harness/prompts.py: RAG prompts quote their context;
open chat is the same questions without it), greedy, each answer until the model stops or --output-len
tokens. Acceptance comes from the chat engine's own counters, exported through Ray's metrics agent
(bench/harness/spec_metrics.py). Speedups are output tokens/s against `none` on the same load.

    .venv/bin/python bench/bench_spec_stack.py                      # ngram, draft_model, none
    .venv/bin/python bench/bench_spec_stack.py --methods ngram,none

Writes bench/results/speculative-stack.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.bench_gateway import measure  # noqa: E402
from bench.harness.engine import DEFAULT_PROFILE, SPECULATION, engine_setup  # noqa: E402
from bench.harness.results import RESULTS_DIR, BenchResult, new_result, write_result  # noqa: E402
from bench.harness.serving import ServingLoad  # noqa: E402
from bench.harness.stack import poolserve_stack, private_profile_path  # noqa: E402

NAME = "speculative-stack"
BASELINE = "none"


def speculative_section(method: str) -> dict:
    """The profile's chat.speculative for a method (SPECULATION's vLLM dicts, in the profile's field names)."""
    config = SPECULATION[method]
    if config is None:
        return {"method": "none"}
    return {
        key: value
        for key, value in config.items()
        if key in ("method", "model", "num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")
    }


def run(profile: Path, methods: list[str], loads: list[ServingLoad], workdir: Path) -> BenchResult:
    rows = []
    engines = {}
    for method in methods:
        run_dir = workdir / method
        run_dir.mkdir()
        overrides = {"speculative": speculative_section(method)}
        with poolserve_stack(profile, run_dir, chat_overrides=overrides) as stack:
            print(f"[bench] {method}: stack healthy in {stack.start_s:.0f}s", flush=True)
            setup = engine_setup(private_profile_path(run_dir))
            engines[method] = setup.describe()
            rows += [
                {**row, "method": method} for row in measure(stack, f"poolserve ({method})", setup, loads, run_dir)
            ]
    base = {(r["dataset"], r["concurrency"]): r["output_throughput"] for r in rows if r["method"] == BASELINE}
    for row in rows:
        reference = base.get((row["dataset"], row["concurrency"]))
        row["speedup_vs_none"] = row["output_throughput"] / reference if reference else None
    metrics = {
        f"speedup_{r['method']}_{r['dataset']}_c{r['concurrency']}": r["speedup_vs_none"]
        for r in rows
        if r["method"] != BASELINE and r["speedup_vs_none"]
    }
    config = {
        "profile": str(profile),
        "methods": methods,
        "engines": engines,
        "loads": [load.describe() for load in loads],
        "path": "poolserve gateway (private stack per method)",
    }
    return new_result(NAME, config, metrics, rows)


def tables(result: BenchResult) -> str:
    load = result.config["loads"][0]
    lines = [
        f"{load['num_prompts']}+ streamed chat requests per row through the gateway, greedy, each answer until "
        f"the model stops or {load['output_len']} tokens; acceptance from the engine's counters",
        "",
        "| traffic | concurrency | method | tok/s | vs none | TTFT p50 ms | TPOT p50 ms | acceptance | tokens/step "
        "| output tokens |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    order = {m: i for i, m in enumerate(result.config["methods"])}
    for row in sorted(result.rows, key=lambda r: (r["dataset"], r["concurrency"], order[r["method"]])):
        spec = row.get("speculation") or {}
        rate = f"{spec['acceptance_rate']:.0f}%" if spec else "-"
        length = f"{spec['acceptance_length']:.2f}" if spec else "-"
        speedup = f"{row['speedup_vs_none']:.2f}x" if row.get("speedup_vs_none") else "-"
        lines.append(
            f"| {row['dataset']} | {row['concurrency']} | {row['method']} | {row['output_throughput']:.1f} | "
            f"{speedup} | {row['median_ttft_ms']:.0f} | {row['median_tpot_ms']:.1f} | {rate} | {length} | "
            f"{row['total_output_tokens']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--methods", type=lambda s: s.split(","), default=["ngram", "draft_model", "none"])
    parser.add_argument("--prompts", type=int, default=12, help="timed requests per row (at least 2x concurrency)")
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    unknown = [m for m in args.methods if m not in SPECULATION]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; known: {', '.join(SPECULATION)}")
    loads = [
        ServingLoad(max(args.prompts, 2 * c), c, output_len=args.output_len, dataset=dataset)
        for dataset in ("rag", "chat")
        for c in args.concurrency
    ]
    workdir = Path(tempfile.mkdtemp(prefix="bench-spec-stack-"))
    result = run(args.profile, args.methods, loads, workdir)
    print(tables(result))
    print(f"wrote {write_result(result, args.out_dir)} (logs in {workdir})")


if __name__ == "__main__":
    main()
