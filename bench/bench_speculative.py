"""Speculative decoding on CPU: none vs ngram vs a truncated draft model, side by side.

Every (method, LD_PRELOAD) variant runs in its own subprocess with a fresh vLLM engine
(offline `LLM`, the embedded default's engine settings: SmolLM2-135M-Instruct, bf16,
max_model_len 4096, a 1 GiB KV pool, prefix caching). The parent compares each variant
with the `none` baseline measured in the same invocation.

Workloads (greedy, max_tokens 96, through `llm.chat`, i.e. the model's chat template):
  rag   the gateway's RAG prompt (rag.prompt.rag_messages) with 4 numbered passages about
        a fictional subject; questions whose answers quote the passages
  chat  generic open questions, no context
Concurrency 1: the prompts one at a time. Concurrency 4: the 4 prompts in one `chat` call.

Heavy: wrap it in the shared lock, e.g.
    flock /tmp/poolserve-heavy.lock .venv/bin/python bench/bench_speculative.py

vLLM's spec-decode counters (vllm:spec_decode_num_drafts / _num_draft_tokens /
_num_accepted_tokens, read through LLM.get_metrics()) give the acceptance rate
(accepted / drafted tokens) and the mean acceptance length (1 + accepted / drafts: tokens
emitted per target-model step).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct"
DRAFT = ROOT / "models" / "SmolLM2-135M-Instruct-draft6"
IOMP = ROOT / ".venv" / "lib" / "libiomp5.so"
TCMALLOC_CANDIDATES = [
    Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"),
    Path("/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"),
]
MAX_TOKENS = 96

# ---- workloads -----------------------------------------------------------------------------
PASSAGES = [
    "The Halvard Tidewater Observatory stands on the basalt cliffs of Kestrel Point, on the "
    "northern tip of the island of Orvane. It was founded in 1887 by the astronomer Ilse "
    "Marrow, who chose the site because the sea fog that covers the lowlands rarely rises "
    "above 140 metres. The observatory's main instrument is a 61-centimetre refracting "
    "telescope built by the Dunmore Optical Works in Glasgow.",
    "Since 1952 the observatory has been run by the Orvane Maritime Trust. The Trust keeps a "
    "staff of eleven people: four astronomers, three technicians, two guides and two "
    "caretakers. Its annual budget of 2.3 million crowns comes mostly from visitor tickets "
    "and a grant from the island council. Visitors reach the cliffs by the Kestrel funicular, "
    "which climbs 212 metres in six minutes.",
    "The observatory is best known for the Marrow Catalogue, a list of 4,318 variable stars "
    "that Ilse Marrow and her assistants recorded between 1889 and 1921. The catalogue was "
    "kept by hand in forty-two green ledgers, which are now stored in the observatory "
    "library. In 2019 volunteers finished transcribing all forty-two ledgers into a public "
    "database.",
    "Public viewing nights take place every Thursday from October to March, when the skies "
    "over Orvane are darkest. Tickets cost 18 crowns for adults and 9 crowns for children "
    "under twelve. Each viewing night is limited to 30 visitors, and warm clothing is "
    "required because the dome is not heated. Viewing nights are cancelled when the wind on "
    "the cliffs is stronger than 60 kilometres per hour.",
]
RAG_QUESTIONS = [
    "Who founded the Halvard Tidewater Observatory, and in which year?",
    "How many variable stars are in the Marrow Catalogue, and how was it kept?",
    "How much does a ticket for a public viewing night cost, and when are viewing nights cancelled?",
    "Who runs the observatory, and how large is its staff?",
]
CHAT_QUESTIONS = [
    "Explain why the sky is blue.",
    "What are the main differences between a cat and a dog as a pet?",
    "Give me three tips for sleeping better.",
    "How does a bicycle stay upright when it moves?",
]
WARMUP = [
    [{"role": "user", "content": "Say hello in one short sentence."}],
    [{"role": "user", "content": "Name a color."}],
    [{"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "user", "content": "Name a fruit."}],
]


def workloads() -> dict[str, list[list[dict]]]:
    sys.path.insert(0, str(ROOT))
    from rag.prompt import RetrievedChunk, rag_messages

    chunks = [
        RetrievedChunk(document_id="observatory", chunk_id=f"observatory#{i}", score=1.0, text=text)
        for i, text in enumerate(PASSAGES)
    ]
    return {
        "rag": [rag_messages(q, chunks) for q in RAG_QUESTIONS],
        "chat": [[{"role": "user", "content": q}] for q in CHAT_QUESTIONS],
    }


# ---- worker: one engine, one method --------------------------------------------------------
def speculative_config(method: str) -> dict | None:
    if method == "none":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    if method == "draft_model":
        return {"method": "draft_model", "model": str(DRAFT), "num_speculative_tokens": 3}
    raise ValueError(method)


def spec_counters(llm) -> dict:
    from vllm.v1.metrics.reader import Counter, Vector

    out = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_pos": []}
    names = {
        "vllm:spec_decode_num_drafts": "drafts",
        "vllm:spec_decode_num_draft_tokens": "draft_tokens",
        "vllm:spec_decode_num_accepted_tokens": "accepted",
    }
    for metric in llm.get_metrics():
        if isinstance(metric, Counter) and metric.name in names:
            out[names[metric.name]] += metric.value
        elif isinstance(metric, Vector) and metric.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            if not out["per_pos"]:
                out["per_pos"] = [0] * len(metric.values)
            out["per_pos"] = [a + b for a, b in zip(out["per_pos"], metric.values)]
    return out


def run_worker(method: str, out_path: str) -> None:
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(
        model=str(MODEL),
        dtype="bfloat16",
        max_model_len=4096,
        kv_cache_memory_bytes=1 << 30,
        enable_prefix_caching=True,
        max_num_seqs=16,
        max_num_batched_tokens=2048,
        speculative_config=speculative_config(method),
        disable_log_stats=False,  # LLM defaults to True, which hides the spec-decode counters
        seed=0,
        enforce_eager=os.environ.get("POOLSERVE_BENCH_EAGER") == "1",
    )
    init_s = time.perf_counter() - t0
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)

    # Warm-up: one request alone and a batch of 4, neither of them timed.
    llm.chat(WARMUP[0], SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
    llm.chat(WARMUP, SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)

    results = []
    for name, prompts in workloads().items():
        for concurrency in (1, 4):
            llm.reset_prefix_cache()  # every phase pays its own prefill
            before = spec_counters(llm)
            start = time.perf_counter()
            if concurrency == 1:
                outputs = [llm.chat(p, greedy, use_tqdm=False)[0] for p in prompts]
            else:
                outputs = llm.chat(prompts, greedy, use_tqdm=False)
            wall = time.perf_counter() - start
            after = spec_counters(llm)
            delta = {k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")}
            delta["per_pos"] = [a - b for a, b in zip(after["per_pos"], before["per_pos"] or [0] * len(after["per_pos"]))]
            results.append({
                "workload": name,
                "concurrency": concurrency,
                "wall_s": wall,
                "tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
                "texts": [o.outputs[0].text for o in outputs],
                "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
                "spec": delta,
            })
    Path(out_path).write_text(json.dumps({"method": method, "init_s": init_s, "results": results}))
    try:
        llm.llm_engine.engine_core.shutdown()
    except Exception:
        pass
    del llm
    gc.collect()


# ---- parent: run every variant in a fresh process, then compare ----------------------------
def preload_value(kind: str) -> str | None:
    """LD_PRELOAD for a variant; None leaves vLLM's own choice (it preloads torch's libgomp)."""
    if kind == "default":
        return None
    libs = []
    if "tcmalloc" in kind:
        found = next((p for p in TCMALLOC_CANDIDATES if p.exists()), None)
        if found is None:
            raise SystemExit("tcmalloc not found (apt-get install -y libtcmalloc-minimal4)")
        libs.append(str(found))
    if "iomp" in kind:
        if not IOMP.exists():
            raise SystemExit(f"{IOMP} not found (pip package intel-openmp)")
        libs.append(str(IOMP))
    return ":".join(libs)


def run_in_own_session(cmd: list[str], env: dict, log: Path, timeout: float) -> int | None:
    """Run a worker in its own session with output to log; its return code, None on a timeout.
    The engine's EngineCore/Worker processes share the session: they end with it, always."""
    with open(log, "w") as logf:
        proc = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def run_variant(method: str, preload: str, timeout: float) -> dict:
    env = dict(os.environ)
    env.setdefault("VLLM_USE_MEGA_AOT_ARTIFACT", "0")  # lets the compile cache reload
    env.pop("LD_PRELOAD", None)
    value = preload_value(preload)
    if value:
        env["LD_PRELOAD"] = value
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        out = tmp.name
    log = Path(tempfile.gettempdir()) / f"bench_spec_{method}_{preload.replace('+', '_')}.log"
    cmd = [sys.executable, __file__, "--worker", method, "--out", out]
    print(f"[bench] {method} / LD_PRELOAD={preload}: starting (log {log})", flush=True)
    start = time.perf_counter()
    rc = run_in_own_session(cmd, env, log, timeout)
    took = time.perf_counter() - start
    if rc != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"[bench] {method}/{preload} failed (rc={rc}, {took:.0f}s); log tail:\n{tail}")
    data = json.loads(Path(out).read_text())
    os.unlink(out)
    data["preload"] = preload
    print(f"[bench] {method} / {preload}: done in {took:.0f}s (engine init {data['init_s']:.0f}s)", flush=True)
    return data


def summarize(runs: list[dict]) -> str:
    base = next(r for r in runs if r["method"] == "none" and r["preload"] == runs[0]["preload"])
    base_by = {(x["workload"], x["concurrency"]): x for x in base["results"]}
    lines = [
        "| method | LD_PRELOAD | workload | conc. | tokens | wall s | tok/s | vs none | acceptance rate | mean accept. len | identical to none |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs:
        for x in run["results"]:
            b = base_by[(x["workload"], x["concurrency"])]
            tps = x["tokens"] / x["wall_s"]
            btps = b["tokens"] / b["wall_s"]
            spec = x["spec"]
            rate = f"{spec['accepted'] / spec['draft_tokens']:.2f}" if spec["draft_tokens"] else "-"
            mal = f"{1 + spec['accepted'] / spec['drafts']:.2f}" if spec["drafts"] else "-"
            same = sum(a == c for a, c in zip(x["token_ids"], b["token_ids"]))
            lines.append(
                f"| {run['method']} | {run['preload']} | {x['workload']} | {x['concurrency']} | {x['tokens']} | "
                f"{x['wall_s']:.1f} | {tps:.1f} | {tps / btps:.2f}x | {rate} | {mal} | {same}/{len(x['token_ids'])} |"
            )
    # Whole-run totals per variant, and each preload variant against the same method's default.
    lines += ["", "| method | LD_PRELOAD | all tokens | all wall s | tok/s | vs none (same run) | vs same method, default preload | engine init s |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]

    def total(run):
        return sum(x["tokens"] for x in run["results"]), sum(x["wall_s"] for x in run["results"])

    bt, bw = total(base)
    for run in runs:
        t, w = total(run)
        ref = next((r for r in runs if r["method"] == run["method"] and r["preload"] == runs[0]["preload"]), None)
        rt, rw = total(ref) if ref else (None, None)
        vs_ref = f"{(t / w) / (rt / rw):.2f}x" if ref else "-"
        lines.append(f"| {run['method']} | {run['preload']} | {t} | {w:.1f} | {t / w:.1f} | {(t / w) / (bt / bw):.2f}x | "
                     f"{vs_ref} | {run['init_s']:.0f} |")
    # bf16 on CPU is not batch-invariant: the same method at concurrency 1 and 4 can already
    # differ, which is the noise floor for "identical to none".
    lines += ["", "| method | LD_PRELOAD | workload | identical answers, conc. 1 vs conc. 4 (same method) |",
              "|---|---|---|---:|"]
    for run in runs:
        by = {(x["workload"], x["concurrency"]): x for x in run["results"]}
        for w in dict.fromkeys(x["workload"] for x in run["results"]):
            a, b = by[(w, 1)]["token_ids"], by[(w, 4)]["token_ids"]
            lines.append(f"| {run['method']} | {run['preload']} | {w} | {sum(x == y for x, y in zip(a, b))}/{len(a)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--methods", default="none,ngram,draft_model")
    parser.add_argument("--preloads", default="default",
                        help="comma list of: default (vLLM's own: torch's libgomp), iomp, tcmalloc+iomp")
    parser.add_argument("--preload-methods", default=None,
                        help="methods to run with the non-default preloads (default: all of --methods)")
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds per variant")
    parser.add_argument("--eager", action="store_true",
                        help="enforce_eager=True, as the embedded default runs (no torch.compile)")
    parser.add_argument("--json", help="also write raw results here")
    parser.add_argument("--from-json", help="only print the tables for results saved with --json")
    args = parser.parse_args()

    if args.from_json:
        print(summarize(json.loads(Path(args.from_json).read_text())))
        return

    if args.worker:
        run_worker(args.worker, args.out)
        return

    if args.eager:
        os.environ["POOLSERVE_BENCH_EAGER"] = "1"  # read by each worker subprocess
    methods = args.methods.split(",")
    preloads = args.preloads.split(",")
    preload_methods = args.preload_methods.split(",") if args.preload_methods else methods
    variants = [(m, preloads[0]) for m in methods]
    variants += [(m, p) for p in preloads[1:] for m in preload_methods]
    if variants[0][0] != "none":
        raise SystemExit("the first method must be none: it is the baseline")
    runs = []
    for m, p in variants:
        runs.append(run_variant(m, p, args.timeout))
        if args.json:  # saved after every variant: a later failure keeps what was measured
            Path(args.json).write_text(json.dumps(runs, indent=1))
    print()
    print(summarize(runs))
    print()
    for run in runs:  # one sample answer per variant, to eyeball quality
        x = run["results"][0]
        print(f"--- {run['method']}/{run['preload']} rag c1 answer 0: {x['texts'][0][:300]!r}")


if __name__ == "__main__":
    main()
