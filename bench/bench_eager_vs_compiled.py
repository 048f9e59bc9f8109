"""vLLM CPU engine modes for the embedded default: torch.compile (vLLM's default) vs eager.

Each variant runs in a fresh subprocess: SmolLM2-135M-Instruct, greedy, 96 tokens, five prompts
(two RAG-style, three open), at concurrency 1 (one at a time) and 4 (one batch). Reports
generated tokens/s as a ratio against the compiled bf16 engine, and how many answers agree with
transformers' own greedy output over the first 24 tokens (the reference implementation).

    flock /tmp/poolserve-heavy.lock .venv/bin/python bench/bench_eager_vs_compiled.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench_speculative import run_in_own_session  # bench/ is sys.path[0] when run as a script

MODEL = Path(__file__).resolve().parents[1] / "models" / "SmolLM2-135M-Instruct"
MAX_TOKENS = 96
AGREE_TOKENS = 24
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


def run_variant(dtype: str, eager: bool) -> dict:
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(model=str(MODEL), dtype=dtype, max_model_len=4096, kv_cache_memory_bytes=1 << 30,
              enforce_eager=eager, enable_prefix_caching=True, seed=0)
    init_s = time.perf_counter() - started
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    convs = conversations()
    llm.chat(convs[:1], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up
    result = {"dtype": dtype, "eager": eager, "init_s": init_s}
    for concurrency in (1, 4):
        llm.reset_prefix_cache()
        t0 = time.perf_counter()
        if concurrency == 1:
            outputs = [llm.chat([c], greedy, use_tqdm=False)[0] for c in convs]
        else:
            outputs = llm.chat(convs, greedy, use_tqdm=False)
        wall = time.perf_counter() - t0
        result[f"c{concurrency}"] = {
            "tok_s": sum(len(o.outputs[0].token_ids) for o in outputs) / wall,
            "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
            "texts": [o.outputs[0].text for o in outputs],
        }
    return result


def transformers_reference() -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    out = []
    for conv in conversations():
        ids = tokenizer.apply_chat_template(conv, add_generation_prompt=True, return_tensors="pt")
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        generated = model.generate(ids, max_new_tokens=AGREE_TOKENS, do_sample=False)
        out.append(generated[0][ids.shape[1]:].tolist())
    return out


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        dtype, eager = sys.argv[2], sys.argv[3] == "eager"
        print("RESULT " + json.dumps(run_variant(dtype, eager)), flush=True)
        return
    reference = transformers_reference()
    env = {**os.environ, "VLLM_USE_AOT_COMPILE": "0"}
    rows = []
    for dtype, eager in VARIANTS:
        log = Path(tempfile.gettempdir()) / f"bench_eager_{dtype}_{'eager' if eager else 'compiled'}.log"
        run_in_own_session([sys.executable, __file__, "--worker", dtype, "eager" if eager else "compiled"],
                           env, log, timeout=900)
        output = log.read_text()
        line = next((l for l in output.splitlines() if l.startswith("RESULT ")), None)
        if line is None:
            raise SystemExit(f"{dtype}/{eager} failed; log {log}:\n{output[-2000:]}")
        rows.append(json.loads(line[len("RESULT "):]))
    base = rows[0]
    print(f"| dtype | mode | init s | tok/s c=1 | vs compiled | tok/s c=4 | vs compiled | agrees with transformers (first {AGREE_TOKENS} tokens) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        agree = sum(ids[:AGREE_TOKENS] == ref[:AGREE_TOKENS] for ids, ref in zip(row["c1"]["token_ids"], reference))
        print(f"| {row['dtype']} | {'eager' if row['eager'] else 'compiled'} | {row['init_s']:.0f} | "
              f"{row['c1']['tok_s']:.1f} | {row['c1']['tok_s'] / base['c1']['tok_s']:.2f}x | "
              f"{row['c4']['tok_s']:.1f} | {row['c4']['tok_s'] / base['c4']['tok_s']:.2f}x | {agree}/{len(reference)} |")
    for row in rows:
        print(f"{row['dtype']}/{'eager' if row['eager'] else 'compiled'}: {row['c1']['texts'][3][:70]!r}")


if __name__ == "__main__":
    main()
