"""The chat engine's CUDA graph plan (GPU): which decode widths vLLM captures, and how.

With MTP every decode step verifies 1 + k tokens per sequence, so the widths a batch can have are
(1 + k) x n for n = 1..max_num_seqs. Public GB10 recipes for Qwen3.8-Flash-Next at MTP 3 pin exactly
those ([4, 8, 12, 16] at 4 sequences) with `cudagraph_mode: FULL_DECODE_ONLY` (full graphs for decode
batches, prefill eager): vLLM's own list ([1, 2, 4] + multiples of 8) leaves a 3-sequence batch padded to 16
and a 5-sequence one uncaptured (usmaneth/Qwen3.8-Flash-Next-Single-DGX-Spark profiles/spark1-best.env;
vllm#56824 runs the same mode). Other speculators keep vLLM's default mode.
"""

from __future__ import annotations

from planner.profile import ChatSpec
from planner.speculative import Drafter


def mtp_capture_sizes(k: int, seqs: int) -> list[int]:
    return [(1 + k) * n for n in range(1, seqs + 1)]


def compilation_config(chat: ChatSpec, drafter: Drafter, seqs: int) -> dict | None:
    """vLLM's compilation_config for a GPU engine; None leaves vLLM's defaults."""
    if chat.enforce_eager:
        return None
    if drafter.method == "mtp":
        sizes = chat.cuda_graph_capture_sizes or mtp_capture_sizes(drafter.k, seqs)
        return {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": sizes}
    if chat.cuda_graph_capture_sizes:
        return {"cudagraph_capture_sizes": chat.cuda_graph_capture_sizes}
    return None
