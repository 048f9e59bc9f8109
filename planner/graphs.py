"""The chat engine's CUDA graph plan (GPU): which decode widths vLLM captures, and how.

Every decode step verifies 1 + k tokens per sequence (k = 0 without speculation), so the widths a
decode batch can have are (1 + k) x n for n = 1..max_num_seqs. GPU engines capture full graphs of
decode batches only (`cudagraph_mode: FULL_DECODE_ONLY`; prefill runs eager), which vLLM 0.26 supports
for the hybrid GDN models (its GDN and FlashAttention backends declare UNIFORM_BATCH graph support) with
and without a drafter. Public GB10 recipes for Qwen3.8-Flash-Next at MTP 3 pin exactly those widths
([4, 8, 12, 16] at 4 sequences; usmaneth/Qwen3.8-Flash-Next-Single-DGX-Spark profiles/spark1-best.env,
vllm#56824) and keep vLLM's torch.compile. Plain decoding compiles too: on an H100 (2026-12-06, raw
vLLM 0.26, the 27B, one stream, 256 in / 128 out) the full decode graph alone decoded at 0.68 of the HBM
roofline and with
torch.compile at 0.81 (its fused kernels), TTFT 197 -> 94 ms, for 66 s of compiling at the first start
(cached after). The other speculators (DSpark, ngram, draft models) capture without torch.compile
(`mode: NONE`; FULL_DECODE_ONLY needs no piecewise compilation) until compiling them is measured;
`chat.torch_compile` pins either way.
"""

from __future__ import annotations

from planner.profile import ChatSpec
from planner.speculative import Drafter

NO_TORCH_COMPILE = 0  # vLLM's CompilationMode.NONE
TORCH_COMPILE = 3  # vLLM's CompilationMode.VLLM_COMPILE
# Where compiling is known to start and to pay: plain decoding (measured, docs/GPU.md) and MTP (the recipes).
COMPILED_BY_DEFAULT = frozenset({"none", "mtp"})


def mtp_capture_sizes(k: int, seqs: int) -> list[int]:
    return [(1 + k) * n for n in range(1, seqs + 1)]


def decode_capture_sizes(k: int, seqs: int) -> list[int]:
    """Every batch of up to 8 sequences, then every 8th and max_num_seqs itself, each (1 + k) tokens wide:
    a decode batch pads to the next captured width, never more than 7 sequences' worth."""
    counts = set(range(1, min(seqs, 8) + 1)) | set(range(16, seqs + 1, 8)) | {seqs}
    return [(1 + k) * n for n in sorted(counts)]


def compilation_config(chat: ChatSpec, drafter: Drafter, seqs: int) -> dict | None:
    """vLLM's compilation_config for a GPU engine; None when it runs eager."""
    if chat.enforce_eager:
        return None
    if drafter.method == "mtp":
        sizes = chat.cuda_graph_capture_sizes or mtp_capture_sizes(drafter.k, seqs)
        config = {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": sizes}
        return config if compiles(chat, drafter) else {"mode": NO_TORCH_COMPILE, **config}
    sizes = chat.cuda_graph_capture_sizes or decode_capture_sizes(drafter.k, seqs)
    return {
        "mode": TORCH_COMPILE if compiles(chat, drafter) else NO_TORCH_COMPILE,
        "cudagraph_mode": "FULL_DECODE_ONLY",
        "cudagraph_capture_sizes": sizes,
    }


def compiles(chat: ChatSpec, drafter: Drafter) -> bool:
    """Whether the engine runs torch.compile before capturing: the profile's pin, else where it was measured."""
    return chat.torch_compile if chat.torch_compile is not None else drafter.method in COMPILED_BY_DEFAULT
