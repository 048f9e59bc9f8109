"""Turn a profile and a pool into exact per-replica numbers; refuse overcommit before anything starts.

Every replica gets planned bytes with a breakdown (one line per byte source), Ray actor options,
env (thread counts) and a start order; the chat replica also gets its vLLM engine arguments.
Ray's own processes, its object store and page-cache headroom for disk-placed tables are planned
out of the same pool. Nothing here imports ray, torch or vllm.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, Field

from planner import runtime
from planner.advice import Overcommit, overcommit_message
from planner.architecture import ArchitectureError, embedding_dimension
from planner.engine import EngineError, plan_engine, utilization_for
from planner.gpu import gpu_fraction
from planner.outputs import ChatModelCard, EngineArgs, GatewaySettings, RayActorOptions
from planner.profile import PoolSpec, Profile, pinned
from planner.units import gib
from planner.weights import safetensors_bytes

START_ORDER = ("chat", "embedder", "retriever", "gateway")


class PlanError(ValueError):
    """The profile does not fit its pool (or a pinned value cannot be kept); the message says why."""


class ReplicaPlan(BaseModel):
    name: str
    kind: Literal["chat", "embedder", "retriever", "gateway"]
    node: str = Field("local", description="Pool (node) the replica is placed on.")
    planned_bytes: int
    breakdown: dict[str, int]
    growth_bytes: int = Field(0, description="Part of planned_bytes not resident at rest: capacity that fills "
                                             "with use (index, caches) and a batch's peak that the replica "
                                             "releases after it; RSS at rest is planned_bytes - growth_bytes.")
    vllm: EngineArgs | None = Field(None, description="vLLM engine arguments (chat replicas only).")
    ray_actor_options: RayActorOptions
    env: dict[str, str] = Field(default_factory=dict)
    start_order: int
    num_replicas: int = Field(1, description="Copies of this replica; each gets planned_bytes.")

    def serve_options(self) -> dict:
        """Ray Serve deployment options for this replica; the app and `poolserve render` both use this."""
        actor = {**self.ray_actor_options.as_dict(), "runtime_env": {"env_vars": dict(self.env)}}
        return {"num_replicas": self.num_replicas, "ray_actor_options": actor}

    @property
    def pool_bytes(self) -> int:
        """What all copies of this replica take from the pool."""
        return self.planned_bytes * self.num_replicas


class PoolPlan(BaseModel):
    name: str = "local"
    total_bytes: int
    reserve_bytes: int
    free_bytes: int = Field(description="total - reserve: what the plan may hand out.")
    cpus: float
    gpu: bool = False
    planned_bytes: int = 0
    ray_bytes: int = 0
    page_cache_bytes: int = 0
    headroom_bytes: int = 0
    start_peak_bytes: int = Field(0, description="Largest engine's start-up transient (GPU): weights in the page "
                                                 "cache, compile, graph capture.")
    start_headroom_bytes: int = Field(0, description="headroom while that engine starts: headroom - start peak.")
    needed_bytes: int = Field(0, description="The smallest pool this plan fits: replicas + Ray + page cache + the "
                                             "largest start peak + reserve (what `--pool` / POOL= should be).")


class ChatFacts(BaseModel):
    kv_bytes_per_token: int
    state_bytes_per_sequence: int = 0
    kv_pool_tokens: int
    weight_bytes: int
    target_kv_bytes_per_token: int = 0
    indexer_bytes_per_token: int = 0
    drafter_kv_bytes_per_token: int = 0
    drafter_weight_bytes: int = 0
    block_size: int = 16
    num_blocks: int = 0
    max_num_seqs: int = 1
    kv_cache_memory_bytes: int = 0
    omp_threads: int = 1
    quantization: str = "none"
    speculative_method: str = "none"
    kv_group_size: int = Field(0, description="vLLM's layer slots per KV-cache group (hybrids; 0: one group).")
    kv_group_layers: list[str] = Field(default_factory=list, description="Real layers per group, kind:count.")
    state_pool_bytes_per_sequence: int = Field(0, description="One state block per sequence as vLLM allocates "
                                               "it: state groups x group size x the attention page.")
    architecture_source: str = ""


class RayPlan(BaseModel):
    object_store_memory: int
    include_dashboard: bool
    num_cpus: float
    memory: int = Field(description="Ray's logical `memory` resource for the node: the replicas' sum.")
    breakdown: dict[str, int]


class Admission(BaseModel):
    name: str
    start_order: int
    free_before_bytes: int = Field(description="Expected free memory when this replica starts in order.")
    free_worst_bytes: int = Field(description="Free memory if every other replica started first.")
    requested_bytes: int
    start_peak_bytes: int = Field(0, description="Transient on top of planned bytes while it starts (GPU engines).")
    start_headroom_bytes: int = Field(0, description="free_before - planned bytes - start peak.")
    overhead_bytes: int = Field(0, description="Memory the engine's own processes hold when vLLM samples free "
                                               "memory (GPU): it is taken from free before the check.")
    check: str
    ok: bool


class Plan(BaseModel):
    profile: str
    pool: PoolPlan
    pools: list[PoolPlan] = Field(default_factory=list)
    replicas: list[ReplicaPlan]
    chat: ChatFacts
    engines: dict[str, ChatFacts] = Field(default_factory=dict, description="Every chat engine's facts by replica "
                                          "name (`chat` is the first).")
    ray: RayPlan
    admission: list[Admission] = Field(default_factory=list)
    threads: dict[str, int] = Field(default_factory=dict)
    page_cache: dict[str, int] = Field(default_factory=dict)
    start_peak: dict[str, int] = Field(default_factory=dict, description="Start lines of the engine whose start is tightest.")
    notes: list[str] = Field(default_factory=list)
    gateway: GatewaySettings = Field(description="Everything the gateway reads (limits, models, budgets).")

    def replica(self, name: str) -> ReplicaPlan:
        for replica in self.replicas:
            if replica.name == name:
                return replica
        raise KeyError(name)


def detect_total_bytes() -> int:
    """Unified memory: the pool is the machine's MemTotal, or the limit of the memory cgroup this process
    runs in when that is smaller (`make serve POOL=...`). A discrete GPU's size is passed in."""
    from stackctl.cgroup import effective_limit_bytes, host_meminfo

    total = host_meminfo().get("MemTotal")
    if not total:
        raise PlanError("cannot read MemTotal from /proc/meminfo; set pools[0].total")
    return min(total, effective_limit_bytes() or total)


def embedder_dimension(profile: Profile) -> int:
    """retriever.dim when set, else the embedder's hidden size: one number for the plan and the index."""
    if profile.retriever.dim:
        return profile.retriever.dim
    try:
        return embedding_dimension(profile.embedder.model)
    except ArchitectureError as exc:
        raise PlanError(f"{exc}; set retriever.dim") from exc


def _side_replicas(profile: Profile, gpu: bool, dim: int, first_order: int = 1,
                   pool_bytes: int = 0) -> list[ReplicaPlan]:
    emb, ret, gw = profile.embedder, profile.retriever, profile.gateway
    emb_weights = safetensors_bytes(emb.model)
    if not emb_weights:
        raise PlanError(f"no safetensors weights in embedder.model {emb.model}")
    heads = max(1, dim // 32)
    # live hidden states, q/k/v and the MLP input of one layer, plus one layer's attention scores (fp32)
    if gpu:  # measured on an H200: linear in tokens, and kept reserved by torch's allocator
        emb_act = emb.batch_size * emb.max_seq_tokens * dim * runtime.EMBEDDER_GPU_ACT_PER_TOKEN_DIM
    else:
        emb_act = emb.batch_size * emb.max_seq_tokens * (dim * 16 + heads * emb.max_seq_tokens * 4)
    emb_lines = {"weights (fp32)": emb_weights, "activations": emb_act, "runtime": runtime.EMBEDDER_RUNTIME,
                 "mapped_files": runtime.EMBEDDER_MAPPED_FILES}
    if gpu:
        emb_lines["cuda_context"] = runtime.EMBEDDER_CUDA_CONTEXT
    n = ret.capacity_chunks
    index = n * dim * 4 if ret.index == "flat" else n * (dim * 4 + ret.hnsw_m * 8)
    ret_lines = {f"index.{ret.index} ({n:,} x {dim})": index, "index.id_map": n * 56,
                 "sqlite_cache": ret.sqlite_cache_bytes, "runtime": runtime.RETRIEVER_RUNTIME,
                 "mapped_files": runtime.RETRIEVER_MAPPED_FILES}
    gw_lines = {"runtime (OpenAiIngress)": runtime.GATEWAY_RUNTIME, "mapped_files": runtime.GATEWAY_MAPPED_FILES,
                "request_buffers": 2 * gw.max_body_bytes, "traffic_growth": runtime.GATEWAY_TRAFFIC_GROWTH}
    # Extraction workers: idle parsers at rest; each document's child may grow to its address-space cap.
    ext = profile.rag.extraction
    extraction_growth = ext.workers * ext.memory_bytes
    gw_lines.update({"extraction.workers": ext.workers * runtime.EXTRACTION_WORKER,
                     "extraction.documents (memory cap)": extraction_growth})

    def replica(name, lines, spec, threads, order, growth=0, gpus=0.0, copies=1):
        env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
        total = sum(lines.values())
        opts = RayActorOptions(num_cpus=spec.num_cpus, memory=total, num_gpus=gpus or None)
        return ReplicaPlan(name=name, kind=name, planned_bytes=total, breakdown=lines, growth_bytes=growth,
                           ray_actor_options=opts, env=env, start_order=order, num_replicas=copies)

    return [
        replica("embedder", emb_lines, emb, emb.torch_threads, first_order, growth=0 if gpu else emb_act,
                gpus=gpu_fraction(sum(emb_lines.values()), pool_bytes) if gpu else 0.0),
        replica("retriever", ret_lines, ret, ret.faiss_threads, first_order + 1,
                growth=index + n * 56 + ret.sqlite_cache_bytes),
        replica("gateway", gw_lines, gw, 1, first_order + 2, growth=2 * gw.max_body_bytes + runtime.GATEWAY_TRAFFIC_GROWTH + extraction_growth,
                copies=gw.replicas),
    ]


def _ray_plan(profile: Profile, cpus: float, replicas: list[ReplicaPlan]) -> RayPlan:
    lines = dict(runtime.RAY_SYSTEM)
    if profile.ray.include_dashboard:
        lines["dashboard"] = runtime.RAY_DASHBOARD
    store = max(profile.ray.object_store_memory, runtime.RAY_OBJECT_STORE_MIN)
    lines["object_store"] = store
    return RayPlan(object_store_memory=store, include_dashboard=profile.ray.include_dashboard, num_cpus=cpus,
                   memory=sum(r.pool_bytes for r in replicas), breakdown=lines)


def _pool_for(profile: Profile, pool_total_bytes: int | None) -> tuple[PoolSpec, int, float]:
    spec = profile.pools[0]
    names = {p.name for p in profile.pools}
    for section in (profile.chat, *profile.engines, profile.embedder, profile.retriever):
        if section.node and section.node not in names:
            raise PlanError(f"{section.node!r} names no pool; pools: {', '.join(sorted(names))}")
        if section.node and section.node != spec.name:
            raise PlanError("placing replicas on a second node is not planned yet (one node runs here); "
                            f"remove node: {section.node}")
    total = pool_total_bytes or (detect_total_bytes() if spec.total == "auto" else spec.total)
    cpus = float(os.cpu_count() or 1) if spec.cpus == "auto" else float(spec.cpus)
    return spec, total, cpus


def build_plan(profile: Profile, pool_total_bytes: int | None = None, advise: bool = True) -> Plan:
    """advise=False: an overcommit raises a bare Overcommit (advice re-plans through this)."""
    spec, total, cpus = _pool_for(profile, pool_total_bytes)
    free = total - spec.reserve
    other_threads = profile.embedder.torch_threads
    engines, engine_replicas = {}, []
    for order, (name, chat) in enumerate(profile.chat_engines()):
        try:
            eng = plan_engine(chat, spec, cpus, total, other_threads)
        except (EngineError, ArchitectureError) as exc:
            raise PlanError(f"{name}: {exc}" if name != "chat" else str(exc)) from exc
        chat_bytes = sum(eng.breakdown.values())
        vllm = eng.vllm
        if spec.gpu:
            vllm = vllm.model_copy(update={"gpu_memory_utilization": _utilization(name, chat, chat_bytes, total)})
        chat_opts = RayActorOptions(num_cpus=chat.num_cpus, memory=chat_bytes,
                                    num_gpus=gpu_fraction(chat_bytes, total) if spec.gpu else None)
        engine_replicas.append(ReplicaPlan(name=name, kind="chat", planned_bytes=chat_bytes, breakdown=eng.breakdown,
                                           vllm=vllm, ray_actor_options=chat_opts, env=eng.env,
                                           start_order=order, growth_bytes=runtime.VLLM_TRAFFIC_GROWTH))
        engines[name] = (chat, eng)
    eng = engines["chat"][1]
    replicas = [*engine_replicas, *_side_replicas(profile, spec.gpu, embedder_dimension(profile), len(engines),
                                                     pool_bytes=total)]
    ray = _ray_plan(profile, cpus, replicas)
    ray_bytes = sum(ray.breakdown.values())
    page_cache = {f"page_cache.{name}.{c} (on disk, {gib(b)})": chat.disk_page_cache_bytes
                  for name, (chat, e) in engines.items() for c, b in e.disk_components.items()}
    needed = sum(r.pool_bytes for r in replicas) + ray_bytes + sum(page_cache.values())
    if needed > free:
        if not advise:
            raise Overcommit(f"short by {gib(needed - free)}", needed, free)
        raise PlanError(overcommit_message(profile, spec, total, free, replicas, ray.breakdown, page_cache, eng))
    want_cpus = sum(r.ray_actor_options.num_cpus * r.num_replicas for r in replicas)
    if want_cpus > cpus:
        raise PlanError(f"replicas ask for {want_cpus:g} Ray CPUs but pool {spec.name} has {cpus:g}: lower the "
                        "num_cpus of chat/embedder/retriever/gateway (fractions are fine)")
    starts = {name: _start_lines(name, chat, e) for name, (chat, e) in engines.items()}
    notes = [n for name, (_, e) in engines.items() for n in e.notes]
    admission = _admission(replicas, total, spec, ray_bytes + sum(page_cache.values()), notes, starts)
    # Headroom at start: the tightest moment of the start order (an engine at its start peak).
    tightest = min(a.start_headroom_bytes for a in admission)
    engine_rows = [a for a in admission if a.name in starts]
    start = starts[min(engine_rows, key=lambda a: a.start_headroom_bytes).name] if engine_rows else {}
    pool = PoolPlan(name=spec.name, total_bytes=total, reserve_bytes=spec.reserve, free_bytes=free, cpus=cpus,
                    gpu=spec.gpu, planned_bytes=needed - ray_bytes - sum(page_cache.values()), ray_bytes=ray_bytes,
                    page_cache_bytes=sum(page_cache.values()), headroom_bytes=free - needed,
                    start_peak_bytes=sum(start.values()),
                    start_headroom_bytes=min(free - needed, tightest),
                    needed_bytes=needed + max(a.start_peak_bytes for a in admission) + spec.reserve)
    facts = {name: ChatFacts(**{k: v for k, v in e.facts.items() if k in ChatFacts.model_fields},
                             architecture_source=e.arch.source) for name, (_, e) in engines.items()}
    return Plan(
        profile=profile.name, pool=pool, pools=[pool], replicas=replicas,
        chat=facts["chat"], engines=facts, ray=ray, admission=admission,
        threads={"cpus": int(cpus), "chat_omp": eng.facts["omp_threads"],
                 "embedder_torch": profile.embedder.torch_threads,
                 "embedder_ingest_most": _embedder_ingest_threads(profile, spec, cpus),
                 "faiss": profile.retriever.faiss_threads,
                 "gateway": 1},
        page_cache=page_cache, start_peak=start, notes=notes, gateway=_gateway_settings(profile, replicas),
    )


def _embedder_ingest_threads(profile: Profile, spec: PoolSpec, cpus: float) -> int:
    """The most threads a document batch may borrow (EmbedderSpec.ingest_threads): on a GPU the forward
    pass is not the CPU's, so it keeps torch_threads unless the profile pins more."""
    emb = profile.embedder
    default = emb.torch_threads if spec.gpu else int(cpus)
    return max(emb.torch_threads, emb.ingest_threads or default)


def _gateway_settings(profile: Profile, replicas: list[ReplicaPlan]) -> GatewaySettings:
    by_name = {r.name: r for r in replicas}
    cards = {spec.model_id: ChatModelCard(path=spec.model, max_model_len=by_name[name].vllm.max_model_len,
                                          replica=name) for name, spec in profile.chat_engines()}
    limits = profile.gateway.model_dump(include={"max_choices", "max_prompts", "max_embedding_inputs",
                                                 "unavailable_retry_after_s"})
    return GatewaySettings(
        **profile.rag.model_dump(), **limits, chat_model_id=profile.chat.model_id, chat_models=cards,
        embed_model_id=profile.embedder.model_id, state_dir=profile.state_dir,
        planned_bytes={r.name: r.planned_bytes for r in replicas},
        planned_at_rest_bytes={r.name: r.planned_bytes - r.growth_bytes for r in replicas})


def _start_lines(name: str, chat, eng) -> dict[str, int]:
    """An engine's start-up transient, beyond its steady lines (runtime.START_*): its checkpoint in the
    page cache while it is copied, and compile / graph capture when not eager."""
    weights = eng.facts["weight_bytes"] + eng.facts["drafter_weight_bytes"]
    lines = {f"start.{name}.weights_page_cache": min(runtime.START_WEIGHT_READ, weights)}
    if not chat.enforce_eager:
        lines[f"start.{name}.compile"] = runtime.START_COMPILE
        lines[f"start.{name}.cuda_graph_capture"] = runtime.START_GRAPH_CAPTURE
    return lines


def _utilization(name: str, chat, planned: int, total: int) -> float:
    """The engine's gpu_memory_utilization: covers exactly its planned bytes, or the pinned value if that does."""
    util = chat.gpu_memory_utilization
    if util is None:
        return utilization_for(planned, total)
    if util * total < planned:
        raise PlanError(f"{name}.gpu_memory_utilization {util} is pinned: {gib(util * total)} of the pool, "
                        f"but the engine is planned at {gib(planned)}; unpin it or raise it to "
                        f"{utilization_for(planned, total)}")
    return util


def _admission(replicas: list[ReplicaPlan], total: int, spec: PoolSpec, outside: int,
               notes: list[str], starts: dict[str, dict[str, int]] | None = None) -> list[Admission]:
    """Engines start one at a time; vLLM refuses util x total > free (GPU) or KV > MemAvailable (CPU).
    Reads the replicas only: a plan is never edited by its admission check."""
    rows = []
    base = total - spec.reserve - outside
    started = 0
    everyone = sum(r.pool_bytes for r in replicas)
    for r in sorted(replicas, key=lambda r: r.start_order):
        free_before, worst = base - started, base - (everyone - r.pool_bytes)
        overhead = 0
        if r.kind == "chat" and spec.gpu:
            util = r.vllm.gpu_memory_utilization
            overhead = runtime.VLLM_GPU_START_OVERHEAD
            requested = int(util * total)
            check = f"util {util} x total <= free - {gib(overhead)} of its own start-up (sampled after it)"
        elif r.kind == "chat":
            requested, check = r.vllm.kv_cache_memory_bytes, "kv_cache_memory_bytes <= MemAvailable"
        else:
            requested, check = r.pool_bytes, "planned bytes <= free"
        ok = requested <= free_before - overhead
        if not ok:
            raise PlanError(f"{r.name} would be refused at start: {check} fails ({gib(requested)} requested, "
                            f"{gib(free_before)} free at its turn, {gib(free_before - overhead)} when vLLM looks)")
        peak = sum((starts or {}).get(r.name, {}).values())
        if free_before - r.pool_bytes < peak:
            raise PlanError(f"{r.name} would run out while it starts: {gib(free_before)} free at its turn, "
                            f"{gib(r.pool_bytes)} planned + {gib(peak)} start peak ({', '.join(starts[r.name])})")
        if requested > worst - overhead:
            notes.append(f"{r.name}: admission needs start order (passes only if started before the others)")
        rows.append(Admission(name=r.name, start_order=r.start_order, free_before_bytes=free_before,
                              free_worst_bytes=worst, requested_bytes=requested, overhead_bytes=overhead,
                              start_peak_bytes=peak, start_headroom_bytes=free_before - r.pool_bytes - peak,
                              check=check, ok=ok))
        started += r.pool_bytes
    return rows


__all__ = ["Plan", "PlanError", "ReplicaPlan", "PoolPlan", "ChatFacts", "RayPlan", "Admission", "build_plan",
           "detect_total_bytes", "embedder_dimension", "pinned"]
