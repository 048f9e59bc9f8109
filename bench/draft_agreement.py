"""Why the truncated draft loses: how often it agrees with the target, and what it costs.

Teacher-forced, outside vLLM (transformers, fp32 on CPU): for each prompt of
bench_speculative.py, the target's own greedy answer is appended to the prompt and both models
score the whole sequence in one forward pass. At every answer position we compare the draft's
top-1 token with the target's top-1 token. That agreement rate is what a draft could at best
get accepted at its first position (vLLM's per-position acceptance rate 1). It also times one
forward of each model on the same sequence (the draft's cost relative to the target).

    flock /tmp/poolserve-heavy.lock .venv/bin/python bench/draft_agreement.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from bench_speculative import DRAFT, MAX_TOKENS, MODEL, workloads  # noqa: E402


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(MODEL)
    target = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(DRAFT, torch_dtype=torch.float32).eval()
    print(f"target layers {target.config.num_hidden_layers}, draft layers {draft.config.num_hidden_layers}")
    print()
    print("| workload | answer tokens | draft top-1 = target top-1 | draft forward / target forward (time) |")
    print("|---|---:|---:|---:|")
    for name, prompts in workloads().items():
        agree = total = 0
        t_target = t_draft = 0.0
        for messages in prompts:
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
            ids = ids["input_ids"]
            with torch.no_grad():
                answer = target.generate(ids, max_new_tokens=MAX_TOKENS, do_sample=False)[:, ids.shape[1]:]
                full = torch.cat([ids, answer], dim=1)
                start = time.perf_counter()
                t_logits = target(full).logits
                t_target += time.perf_counter() - start
                start = time.perf_counter()
                d_logits = draft(full).logits
                t_draft += time.perf_counter() - start
            # logits at position p predict token p+1: compare over the answer's positions
            span = slice(ids.shape[1] - 1, full.shape[1] - 1)
            t_top = t_logits[0, span].argmax(-1)
            d_top = d_logits[0, span].argmax(-1)
            agree += int((t_top == d_top).sum())
            total += int(t_top.numel())
        print(f"| {name} | {total} | {agree / total:.2f} | {t_draft / t_target:.2f} |")


if __name__ == "__main__":
    main()
