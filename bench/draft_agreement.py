"""Why the truncated draft loses: how often it agrees with the target, and what it costs.

Teacher-forced, outside vLLM (transformers, fp32 on CPU): for each prompt of
bench_speculative.py, the target's own greedy answer is appended to the prompt and both models
score the whole sequence in one forward pass. At every answer position we compare the draft's
top-1 token with the target's top-1 token. That agreement rate is what a draft could at best
get accepted at its first position (vLLM's per-position acceptance rate 1). It also times one
forward of each model on the same sequence (the draft's cost relative to the target).
The target is the profile's chat model (configs/cpu-tiny.yaml), the draft models/SmolLM2-135M-Instruct-draft6.

    flock /tmp/poolserve-heavy.lock .venv/bin/python bench/draft_agreement.py

Writes bench/results/draft-agreement.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.bench_speculative import MAX_TOKENS, workloads  # noqa: E402
from bench.harness.engine import DEFAULT_PROFILE, DRAFT_MODEL, engine_setup  # noqa: E402
from bench.harness.results import RESULTS_DIR, BenchResult, new_result, write_result  # noqa: E402
from bench.harness.timing import Stopwatch  # noqa: E402

NAME = "draft-agreement"
TORCH_THREADS = 2


def run(profile: Path) -> BenchResult:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(TORCH_THREADS)
    target_path = engine_setup(profile).model
    tok = AutoTokenizer.from_pretrained(target_path)
    target = AutoModelForCausalLM.from_pretrained(target_path, torch_dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(DRAFT_MODEL, torch_dtype=torch.float32).eval()
    print(f"target layers {target.config.num_hidden_layers}, draft layers {draft.config.num_hidden_layers}")
    rows = []
    for name, prompts in workloads().items():
        agree = total = 0
        t_target = t_draft = 0.0
        for messages in prompts:
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
            ids = ids["input_ids"]
            with torch.no_grad():
                answer = target.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False)[:, ids.shape[1] :]
                full = torch.cat([ids, answer], dim=1)
                with Stopwatch() as target_forward:
                    t_logits = target(full).logits
                with Stopwatch() as draft_forward:
                    d_logits = draft(full).logits
            t_target += target_forward.seconds
            t_draft += draft_forward.seconds
            # logits at position p predict token p+1: compare over the answer's positions
            span = slice(ids.shape[1] - 1, full.shape[1] - 1)
            agree += int((t_logits[0, span].argmax(-1) == d_logits[0, span].argmax(-1)).sum())
            total += int(full.shape[1] - ids.shape[1])
        rows.append(
            {
                "workload": name,
                "answer_tokens": total,
                "agreement": agree / total,
                "draft_vs_target_forward_time": t_draft / t_target,
            }
        )
    config = {
        "target": target_path,
        "draft": str(DRAFT_MODEL),
        "target_layers": target.config.num_hidden_layers,
        "draft_layers": draft.config.num_hidden_layers,
        "max_tokens": MAX_TOKENS,
        "dtype": "float32",
        "torch_threads": TORCH_THREADS,
    }
    return new_result(NAME, config, {f"agreement_{r['workload']}": r["agreement"] for r in rows}, rows)


def tables(result: BenchResult) -> str:
    lines = [
        "| workload | answer tokens | draft top-1 = target top-1 | draft forward / target forward (time) |",
        "|---|---:|---:|---:|",
    ]
    for r in result.rows:
        lines.append(
            f"| {r['workload']} | {r['answer_tokens']} | {r['agreement']:.2f} | "
            f"{r['draft_vs_target_forward_time']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    result = run(args.profile)
    print()
    print(tables(result))
    print(f"wrote {write_result(result, args.out_dir)}")


if __name__ == "__main__":
    main()
