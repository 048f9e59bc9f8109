"""The embedder's activations: one batch's worth, what its replica holds at its peak.

Read from the sentence-transformers folder's config.json: the checkpoint's dtype (transformers 5 loads it
so, and activations follow it), the attention heads, and whether the model's attention materialises its
scores. BERT-like models (all-MiniLM-L6-v2) run torch's fused SDPA kernel on a GPU, linear in tokens;
MPNet's attention adds a relative position bias to explicit scores (transformers' MPNetSelfAttention has
no SDPA path), so it holds batch x heads x length^2 scores, bias and softmax at once.
"""

from __future__ import annotations

import json
from pathlib import Path

from planner import runtime

# model_type values whose attention always materialises its scores (measured: mpnet, docs/BENCHMARKS.md 6.2)
EAGER_ATTENTION_TYPES = frozenset({"mpnet"})


def model_config(model_dir: str) -> dict:
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def checkpoint_dtype_bytes(config: dict) -> int:
    """Bytes per weight as saved (config.json dtype); 4 when it does not say."""
    return {"float16": 2, "bfloat16": 2}.get(config.get("dtype") or config.get("torch_dtype"), 4)


def activation_bytes(model_dir: str, dim: int, batch: int, seq: int, gpu: bool) -> int:
    """One batch of `batch` inputs of `seq` tokens through the embedder at `model_dir` (hidden size `dim`)."""
    config = model_config(model_dir)
    heads = int(config.get("num_attention_heads") or max(1, dim // 32))
    eager = config.get("model_type") in EAGER_ATTENTION_TYPES
    scores = batch * heads * seq * seq * runtime.EMBEDDER_EAGER_SCORE_BYTES if eager else 0
    if gpu:  # measured on an H200 and an H100: kept reserved by torch's allocator after the batch
        per_token_dim = (
            runtime.EMBEDDER_GPU_EAGER_ACT_PER_TOKEN_DIM if eager else runtime.EMBEDDER_GPU_ACT_PER_TOKEN_DIM
        )
        return (batch * seq * dim * per_token_dim + scores) * checkpoint_dtype_bytes(config) // 4
    # CPU (fp32): one layer's hidden states, q/k/v, the MLP's 4x-wide input and its activation (32 bytes a
    # token and hidden unit), and its scores with their softmax. Measured with MiniLM at 256 tokens, as one
    # process's anon growth over a batch (2026-12-06): 10.3 / 35.0 / 71.1 / 134.4 / 250.1 MiB at batch 1 / 4 /
    # 8 / 16 / 32, where this plans 9.0 / 36.0 / 72.0 / 144.0 / 288.0 (the line before planned 4.5 / 18.0 / ...).
    return batch * seq * dim * 32 + (scores or 2 * batch * heads * seq * seq * 4)
