"""vLLM CPU engine modes for the embedded default: torch.compile (vLLM's default) vs eager.

Each variant runs in a fresh subprocess: the profile's planned chat engine (configs/cpu-tiny.yaml:
SmolLM2-135M-Instruct, its planned max_model_len, KV pool, batch limits and environment) with only
dtype, enforce_eager and speculative_config=None (no speculation, so the mode alone differs) overridden.
Greedy, 96 tokens, five prompts (two RAG-style, three open), at concurrency 1 (one at a time) and 4
(one batch). Reports generated tokens/s as a ratio against the compiled bf16 engine, and how many
answers agree with transformers' own greedy output over the first 24 tokens (the reference).

    flock /tmp/poolserve-heavy.lock .venv/bin/python bench/bench_eager_vs_compiled.py

Writes bench/results/eager-vs-compiled.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.harness.engine import DEFAULT_PROFILE, engine_setup  # noqa: E402
from bench.harness.procs import child_env, run_in_own_session  # noqa: E402
from bench.harness.results import RESULTS_DIR, BenchResult, new_result, write_result  # noqa: E402
from bench.harness.timing import Stopwatch  # noqa: E402

NAME = "eager-vs-compiled"
MAX_TOKENS = 96
AGREE_TOKENS = 24
WORKER_TIMEOUT_S = 900
CONTEXT = ("[1] The Velmora bridge spans the Istra river and was opened in 1962 by mayor Ana Kovac. "
           "[2] It is 412 metres long and carries two tram lines and four lanes of traffic. "
           "[3] The bridge was repainted green in 2019 after a public vote.")
QUESTIONS = ["How long is the Velmora bridge and what does it carry?", "Who opened the Velmora bridge, and when?",
             "List three uses of copper.", "What is the capital of France?", "Explain why the sky is blue."]
VARIANTS = [("bfloat16", False), ("bfloat16", True), ("float32", True)]


def conversations() -> list[list[dict]]:
    system = {"role": "system", "content": f"Answer from the context only.\n{CONTEXT}"}
    return [[system, {"role": "user", "content": q}] if i < 2 else [{"role": "user", "content": q}]
            for i, q in enumerate(QUESTIONS)]


def variant_setup(profile: Path, dtype: str, eager: bool):
    return engine_setup(profile, {"dtype": dtype, "enforce_eager": eager, "speculative_config": None})


def run_variant(profile: Path, dtype: str, eager: bool) -> dict:
    from vllm import LLM, SamplingParams

    with Stopwatch() as init:
        llm = LLM(**variant_setup(profile, dtype, eager).llm_kwargs(seed=0))
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    convs = conversations()
    llm.chat(convs[:1], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up
    result = {"dtype": dtype, "eager": eager, "init_s": init.seconds}
    for concurrency in (1, 4):
        llm.reset_prefix_cache()
        with Stopwatch() as phase:
            if concurrency == 1:
                outputs = [llm.chat([c], greedy, use_tqdm=False)[0] for c in convs]
            else:
                outputs = llm.chat(convs, greedy, use_tqdm=False)
        result[f"c{concurrency}"] = {
            "tok_s": sum(len(o.outputs[0].token_ids) for o in outputs) / phase.seconds,
            "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            "texts": [o.outputs[0].text for o in outputs],
        }
    return result


def transformers_reference(model: str) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    reference = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    out = []
    for conv in conversations():
        ids = tokenizer.apply_chat_template(conv, add_generation_prompt=True, return_tensors="pt")
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        generated = reference.generate(ids, max_new_tokens=AGREE_TOKENS, do_sample=False)
        out.append(generated[0][ids.shape[1]:].tolist())
    return out


def run(profile: Path) -> BenchResult:
    reference = transformers_reference(engine_setup(profile).model)
    rows = []
    for dtype, eager in VARIANTS:
        mode = "eager" if eager else "compiled"
        log = Path(tempfile.gettempdir()) / f"bench_eager_{dtype}_{mode}.log"
        env = child_env(variant_setup(profile, dtype, eager).env)
        run_in_own_session([sys.executable, __file__, "--worker", dtype, mode, "--profile", str(profile)],
                           env, log, WORKER_TIMEOUT_S)
        output = log.read_text()
        line = next((line for line in output.splitlines() if line.startswith("RESULT ")), None)
        if line is None:
            raise SystemExit(f"{dtype}/{mode} failed; log {log}:\n{output[-2000:]}")
        row = json.loads(line[len("RESULT "):])
        row["agree"] = sum(ids[:AGREE_TOKENS] == ref[:AGREE_TOKENS] for ids, ref in zip(row["c1"]["token_ids"], reference))
        rows.append(row)
    config = {"variants": [{"dtype": d, "eager": e} for d, e in VARIANTS], "max_tokens": MAX_TOKENS,
              "agree_tokens": AGREE_TOKENS, "questions": QUESTIONS, "engine": variant_setup(profile, *VARIANTS[0]).describe()}
    metrics = {f"tok_s_c1_{r['dtype']}_{'eager' if r['eager'] else 'compiled'}": r["c1"]["tok_s"] for r in rows}
    return new_result(NAME, config, metrics, rows)


def tables(result: BenchResult) -> str:
    rows, n = result.rows, len(result.config["questions"])
    base = rows[0]
    lines = [f"| dtype | mode | init s | tok/s c=1 | vs compiled | tok/s c=4 | vs compiled | agrees with transformers "
             f"(first {result.config['agree_tokens']} tokens) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['dtype']} | {'eager' if row['eager'] else 'compiled'} | {row['init_s']:.0f} | "
                     f"{row['c1']['tok_s']:.1f} | {row['c1']['tok_s'] / base['c1']['tok_s']:.2f}x | "
                     f"{row['c4']['tok_s']:.1f} | {row['c4']['tok_s'] / base['c4']['tok_s']:.2f}x | {row['agree']}/{n} |")
    for row in rows:
        lines.append(f"{row['dtype']}/{'eager' if row['eager'] else 'compiled'}: {row['c1']['texts'][3][:70]!r}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", nargs=2, metavar=("DTYPE", "MODE"), help=argparse.SUPPRESS)
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    if args.worker:
        dtype, mode = args.worker
        print("RESULT " + json.dumps(run_variant(args.profile, dtype, mode == "eager")), flush=True)
        return
    result = run(args.profile)
    print(tables(result))
    print(f"wrote {write_result(result, args.out_dir)}")


if __name__ == "__main__":
    main()
