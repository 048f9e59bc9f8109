"""Start figures for a vLLM engine on a unified-memory GPU pool (DGX Spark / GB10), from public GB10 runs.

The generic GPU lines (runtime.CUDA_CONTEXT, CUDA_GRAPHS, VLLM_WORKER_GPU, START_GRAPH_CAPTURE) are
estimates that the H200 measurements recalibrate; where a public GB10 run measured more, the plan
carries the difference as its own line (runtime.GB10_*), so the breakdown shows where it came from.
"""

from __future__ import annotations

from planner import runtime

# The worker's lines that GB10_VLLM_OVERHEAD covers (everything but weights and the KV cache).
_OVERHEAD_LINES = ("activations", "runtime.worker", "cuda_context.worker", "cuda_graphs")
OVERHEAD_LINE = "runtime.gb10_overhead (llamastash#80: 5.4-6.7 GiB beyond weights + KV)"


def overhead_lines(breakdown: dict[str, int]) -> dict[str, int]:
    """What the measured GB10 overhead adds beyond the worker's lines already planned."""
    planned = sum(breakdown.get(line, 0) for line in _OVERHEAD_LINES)
    extra = runtime.GB10_VLLM_OVERHEAD - planned
    return {OVERHEAD_LINE: extra} if extra > 0 else {}


def speculator_capture_peak() -> int:
    """The start peak of a speculator's CUDA graph capture, as measured on a GB10 (never below the estimate)."""
    return max(runtime.START_GRAPH_CAPTURE, runtime.GB10_SPECULATOR_GRAPH_CAPTURE)
