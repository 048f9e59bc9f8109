"""The embedder's activations line (planner/embedder.py) against what a GPU and the CPU measured."""

from __future__ import annotations

import json
from pathlib import Path

from planner import runtime
from planner.embedder import EAGER_ATTENTION_TYPES, activation_bytes

ROOT = Path(__file__).resolve().parents[3]
MiB = 2**20


def _folder(tmp_path: Path, name: str, **config) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return str(folder)


def test_a_fused_attention_model_is_linear_in_tokens_and_follows_its_dtype(tmp_path):
    minilm = _folder(tmp_path, "minilm", model_type="bert", num_attention_heads=12, torch_dtype="float32")
    fp16 = _folder(tmp_path, "fp16", model_type="bert", num_attention_heads=12, dtype="float16")
    gpu = activation_bytes(minilm, 384, 64, 256, gpu=True)
    assert gpu == 64 * 256 * 384 * runtime.EMBEDDER_GPU_ACT_PER_TOKEN_DIM
    assert gpu >= 408 * MiB  # all-MiniLM-L6-v2 fp32, 64 x 256: 408 MiB reserved on an H100 (BENCHMARKS 6.2)
    assert activation_bytes(minilm, 384, 64, 512, gpu=True) == 2 * gpu
    assert activation_bytes(fp16, 384, 64, 256, gpu=True) == gpu // 2
    # CPU: one layer's hidden states (32 bytes a token and unit) and its scores with their softmax, at or above
    # what one batch of MiniLM measured (35.0 MiB at 4 x 256 tokens, 250.1 at 32)
    assert activation_bytes(minilm, 384, 4, 256, gpu=False) == 4 * 256 * (384 * 32 + 2 * 12 * 256 * 4)
    assert activation_bytes(minilm, 384, 4, 256, gpu=False) >= 35.0 * MiB
    assert activation_bytes(minilm, 384, 32, 256, gpu=False) >= 250.1 * MiB


def test_mpnet_materialises_its_scores_and_is_planned_above_what_it_held(tmp_path):
    assert "mpnet" in EAGER_ATTENTION_TYPES
    fp32 = _folder(tmp_path, "fp32", model_type="mpnet", num_attention_heads=12, torch_dtype="float32")
    fp16 = _folder(tmp_path, "fp16", model_type="mpnet", num_attention_heads=12, dtype="float16")
    measured = {(fp32, 256): 914, (fp32, 384): 1802, (fp16, 256): 456, (fp16, 384): 900}  # MiB, H100, batch 64
    for (folder, seq), mib in measured.items():
        planned = activation_bytes(folder, 768, 64, seq, gpu=True)
        assert mib * MiB <= planned <= 1.25 * mib * MiB, (folder, seq, planned / MiB)
    # the heads come from config.json, not from the hidden size (768 // 32 would say 24)
    assert (
        activation_bytes(fp32, 768, 4, 384, gpu=False)
        == 4 * 384 * 768 * 32 + 4 * 12 * 384 * 384 * runtime.EMBEDDER_EAGER_SCORE_BYTES
    )


def test_the_shipped_folders_are_read_as_measured():
    minilm, mpnet = ROOT / "models/all-MiniLM-L6-v2", ROOT / "models/all-mpnet-base-v2"
    if (minilm / "config.json").exists():
        assert activation_bytes(str(minilm), 384, 4, 256, gpu=False) == 37_748_736  # the cpu-tiny plan's line
    if (mpnet / "config.json").exists():
        assert activation_bytes(str(mpnet), 768, 64, 384, gpu=True) > 1802 * MiB
