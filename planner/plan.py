"""Turn a profile and a pool into exact per-replica numbers; refuse overcommit before anything starts.

Every replica gets planned bytes with a breakdown (one line per byte source), Ray actor options,
env (thread counts) and a start order; the chat replica also gets its vLLM engine arguments.
Ray's own processes, its object store and page-cache headroom for disk-placed tables are planned
out of the same pool. Nothing here imports ray, torch or vllm.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections import defaultdict
from typing import Literal

from pydantic import BaseModel, Field

from planner import gb10, nodes, runtime
from planner.advice import overcommit_message
from planner.architecture import ArchitectureError, embedding_dimension
from planner.embedder import activation_bytes
from planner.engine import plan_engine
from planner.engine_args import EngineNode, engine_launch
from planner.engine_split import split_engine
from planner.errors import EngineError, Overcommit, PlanError
from planner.gpu import gpu_fraction, released_at_rest, split_device_lines, torch_device
from planner.guard import guard_plan
from planner.on_demand_plan import OnDemandPlan
from planner.on_demand_pool import on_demand_pool
from planner.outputs import (
    FROM_GATEWAY_SPEC,
    ChatModelCard,
    ContentsPlan,
    EngineArgs,
    GatewayEdge,
    EmbedderSettings,
    GatewaySettings,
    RayActorOptions,
    RetrieverSettings,
)
from planner.profile import PoolSpec, Profile, ServeSpec, pinned
from planner.units import gib
from planner.weights import safetensors_bytes

START_ORDER = ("chat", "embedder", "retriever", "gateway")


class ReplicaPlan(BaseModel):
    name: str
    kind: Literal["chat", "embedder", "retriever", "gateway", "wake_coordinator"]
    node: str = Field("local", description="Pool (node) the replica is placed on.")
    planned_bytes: int
    breakdown: dict[str, int]
    growth_bytes: int = Field(
        0,
        description="Part of planned_bytes not resident at rest: capacity that fills "
        "with use (index, caches) and a batch's peak that the replica "
        "releases after it; RSS at rest is planned_bytes - growth_bytes.",
    )
    vllm: EngineArgs | None = Field(None, description="vLLM engine arguments (chat replicas only).")
    ray_actor_options: RayActorOptions
    env: dict[str, str] = Field(default_factory=dict)
    start_order: int
    num_replicas: int = Field(1, description="Copies of this replica; each gets planned_bytes.")
    host_bytes: int = Field(
        0,
        description="Discrete GPU: the replica's host memory, outside the GPU pool "
        "(planned_bytes and breakdown are then its device memory).",
    )
    host_breakdown: dict[str, int] = Field(default_factory=dict, description="Discrete GPU: the host lines.")
    contents: ContentsPlan | None = Field(
        None,
        description="Retriever: its growth lines for the contents it "
        "holds, so /status can compare against the plan for what is stored.",
    )
    serve: ServeSpec = Field(description="Ray Serve options: the replica section's `serve`.")
    engine_node_rank: int | None = Field(
        None,
        description="A CPU chat engine split over nodes, its share on "
        "another node: the vLLM node_rank its headless ranks run as there.",
    )

    def serve_options(self) -> dict:
        """Ray Serve deployment options for this replica; the app and `poolserve render` both use this."""
        actor = {**self.ray_actor_options.as_dict(), "runtime_env": {"env_vars": dict(self.env)}}
        return {"num_replicas": self.num_replicas, "ray_actor_options": actor, **self.serve.deployment_options()}

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
    discrete: bool = Field(False, description="The pool is a discrete GPU's memory; host lines are outside it.")
    host_bytes: int = Field(0, description="Discrete GPU: replicas' and Ray's host memory, beside the pool.")
    unified: bool = Field(False, description="GPU and CPU share this memory (GB10): one pool for both.")
    planned_bytes: int = 0
    ray_bytes: int = 0
    page_cache_bytes: int = 0
    headroom_bytes: int = 0
    start_peak_bytes: int = Field(
        0, description="Largest engine's start-up transient (GPU): weights in the page cache, compile, graph capture."
    )
    start_headroom_bytes: int = Field(0, description="headroom while that engine starts: headroom - start peak.")
    needed_bytes: int = Field(
        0,
        description="The smallest pool this plan fits: replicas + Ray + page cache + the "
        "largest start peak + reserve (what `--pool` / POOL= should be).",
    )
    # Filled on a plan of several nodes only (left out when empty, so a one-node plan reads as before).
    head: bool = Field(False, exclude_if=lambda v: not v, description="The Ray head node (GCS, Serve controller).")
    replicas: list[str] = Field(
        default_factory=list, exclude_if=lambda v: not v, description="Replicas and engine shares planned on this node."
    )
    ray_breakdown: dict[str, int] = Field(
        default_factory=dict,
        exclude_if=lambda v: not v,
        description="Ray's own processes on this node and its object store.",
    )
    admission: list["Admission"] = Field(
        default_factory=list, exclude_if=lambda v: not v, description="This node's start order and admission."
    )
    start_peak: dict[str, int] = Field(
        default_factory=dict,
        exclude_if=lambda v: not v,
        description="Start lines of this node's tightest engine start.",
    )
    page_cache: dict[str, int] = Field(default_factory=dict, exclude_if=lambda v: not v)
    ray_resources: dict[str, float] = Field(
        default_factory=dict,
        exclude_if=lambda v: not v,
        description="Custom resources this node's `ray start` advertises.",
    )


class ChatFacts(BaseModel):
    vllm_kv_tokens: int = Field(0, description="The 'KV cache size: N tokens' vLLM logs for the KV cache passed.")
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
    state_pool_bytes_per_sequence: int = Field(
        0,
        description="One state block per sequence as vLLM allocates "
        "it: state groups x group size x the attention page.",
    )
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
    overhead_bytes: int = Field(
        0,
        description="Memory the engine's own processes hold when vLLM samples free "
        "memory (GPU): it is taken from free before the check.",
    )
    check: str


PoolPlan.model_rebuild()


class Plan(BaseModel):
    profile: str
    profile_digest: str = Field(
        "",
        description="sha256 of the profile it was made from (profile_digest()): a "
        "plan handed to build_app must be for the profile it runs.",
    )
    pool: PoolPlan
    pools: list[PoolPlan] = Field(default_factory=list, description="Every node's pool (the first is `pool`).")
    replicas: list[ReplicaPlan]
    shares: list[ReplicaPlan] = Field(
        default_factory=list,
        exclude_if=lambda v: not v,
        description="Split "
        "engines: the ranks' share on each node other than the engine's own "
        "(<engine>@<node>); planned in that node's pool, deployed with the engine.",
    )
    chat: ChatFacts
    engines: dict[str, ChatFacts] = Field(
        default_factory=dict, description="Every chat engine's facts by replica name (`chat` is the first)."
    )
    ray: RayPlan
    admission: list[Admission] = Field(default_factory=list)
    threads: dict[str, int] = Field(default_factory=dict)
    page_cache: dict[str, int] = Field(default_factory=dict)
    start_peak: dict[str, int] = Field(
        default_factory=dict, description="Start lines of the engine whose start is tightest."
    )
    notes: list[str] = Field(default_factory=list)
    gateway: GatewaySettings = Field(description="Everything the gateway reads (limits, models, budgets).")
    edge: GatewayEdge = Field(
        description="What the gateway's outer middleware reads, the pool guard's marks (planner/guard.py) included."
    )
    embedder: EmbedderSettings = Field(description="Everything the embedder replica reads.")
    retriever: RetrieverSettings = Field(description="Everything the retriever replica reads.")
    # issue 48: left out of the plan when no engine is on demand (planner/on_demand_pool.py)
    on_demand: OnDemandPlan | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="On-demand chat engines: the awake set the pool holds, each engine's bytes asleep.",
    )

    def replica(self, name: str) -> ReplicaPlan:
        for replica in self.replicas:
            if replica.name == name:
                return replica
        raise KeyError(name)


def detect_gpu_bytes(index: int = 0) -> int:
    """A discrete GPU's memory (NVML), the pool of a `unified: false` profile with `total: auto`."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).total)
        finally:
            pynvml.nvmlShutdown()
    except Exception as exc:  # no driver, no device: the profile must say the size
        raise PlanError(f"cannot read the GPU's memory through NVML ({exc}); set pools[0].total") from exc


def detect_total_bytes() -> int:
    """Unified memory: the pool is the machine's MemTotal, or the limit of the memory cgroup this process
    runs in when that is smaller (`make serve POOL=...`). A discrete GPU's size is passed in."""
    from system.cgroup import effective_limit_bytes, host_meminfo

    total = host_meminfo().get("MemTotal")
    if not total:
        raise PlanError("cannot read MemTotal from /proc/meminfo; set pools[0].total")
    return min(total, effective_limit_bytes() or total)


def profile_digest(profile: Profile) -> str:
    """The profile's identity as planned: its resolved values, not its file's bytes."""
    return hashlib.sha256(profile.model_dump_json().encode()).hexdigest()


def resolved_plan(profile: Profile, handed: dict | None) -> Plan:
    """The plan a stack runs: the one `poolserve up` (or `render`) made and handed over in serve.yaml's
    args, so the numbers preflight checked are the numbers deployed; planned here only when none was."""
    if not handed:
        return build_plan(profile)
    plan = Plan.model_validate(handed)
    if plan.profile_digest != profile_digest(profile):
        raise PlanError(
            f"the plan in serve.yaml's args was made for another version of profile {profile.name}; "
            "run `poolserve render` again, or drop args.plan to plan at start"
        )
    return plan


def detect_cpu_native_bf16() -> bool:
    from system.cpuinfo import cpu_has_native_bf16

    return cpu_has_native_bf16()


def embedder_dimension(profile: Profile) -> int:
    """retriever.dim when set, else the embedder's hidden size: one number for the plan and the index."""
    if profile.retriever.dim:
        return profile.retriever.dim
    try:
        return embedding_dimension(profile.embedder.model)
    except ArchitectureError as exc:
        raise PlanError(f"{exc}; set retriever.dim") from exc


def _side_replicas(
    profile: Profile,
    gpu: bool,
    dim: int,
    first_order: int = 1,
    pool_bytes: int = 0,
    *,
    embedder_ingest_threads: int,
    discrete: bool = False,
) -> list[ReplicaPlan]:
    emb, ret, gw = profile.embedder, profile.retriever, profile.gateway
    emb_weights = safetensors_bytes(emb.model)
    if not emb_weights:
        raise PlanError(f"no safetensors weights in embedder.model {emb.model}")
    emb_act = activation_bytes(emb.model, dim, emb.batch_size, emb.max_seq_tokens, gpu)
    emb_lines = {
        "weights": emb_weights,
        "activations": emb_act,
        "runtime": runtime.EMBEDDER_RUNTIME,
        "mapped_files": runtime.EMBEDDER_MAPPED_FILES,
        "traffic_growth": runtime.EMBEDDER_TRAFFIC_GROWTH,
    }
    if gpu:
        emb_lines["cuda_context"] = runtime.EMBEDDER_CUDA_CONTEXT
    if discrete:
        emb_lines["cuda_host_runtime"] = runtime.EMBEDDER_CUDA_HOST_RUNTIME
    n = ret.capacity_chunks
    index = n * dim * 4 if ret.index == "flat" else n * (dim * 4 + ret.hnsw_m * 8)
    ret_lines = {
        f"index.{ret.index} ({n:,} x {dim})": index,
        "index.id_map": n * 56,
        "sqlite_cache": ret.sqlite_cache_bytes,
        "runtime": runtime.RETRIEVER_RUNTIME,
        "mapped_files": runtime.RETRIEVER_MAPPED_FILES,
    }
    gw_lines = {
        "runtime (OpenAiIngress)": runtime.GATEWAY_RUNTIME,
        "mapped_files": runtime.GATEWAY_MAPPED_FILES,
        "request_buffers": 2 * gw.max_body_bytes,
        "traffic_growth": runtime.GATEWAY_TRAFFIC_GROWTH,
    }
    # Extraction workers: idle parsers at rest; each document's child may grow to its address-space cap.
    ext = profile.rag.extraction
    extraction_growth = ext.workers * ext.memory_bytes
    gw_lines.update(
        {
            "extraction.workers": ext.workers * runtime.EXTRACTION_WORKER,
            "extraction.documents (memory cap)": extraction_growth,
        }
    )

    def replica(name, lines, spec, threads, order, growth=0, gpus=0.0, copies=1, contents=None, env=None):
        env = {
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false",
            **(env or {}),
        }
        total = sum(lines.values())
        opts = RayActorOptions(num_cpus=spec.num_cpus, memory=total, num_gpus=gpus or None)
        return ReplicaPlan(
            name=name,
            kind=name,
            planned_bytes=total,
            breakdown=lines,
            growth_bytes=growth,
            ray_actor_options=opts,
            env=env,
            start_order=order,
            num_replicas=copies,
            contents=contents,
            serve=spec.serve,
        )

    return [
        replica(
            "embedder",
            emb_lines,
            emb,
            emb.torch_threads,
            first_order,
            growth=runtime.EMBEDDER_TRAFFIC_GROWTH + emb_act,  # a GPU embedder empties torch's cache too
            gpus=gpu_fraction(sum(emb_lines.values()), pool_bytes) if gpu else 0.0,
            # Documents are tokenized for chunking and embedding in batches spread over the ingest threads
            # (the tokenizer's pool, sized once at its first use); one thread each was the GPU ingest's floor.
            env={
                **({} if gpu else {"MALLOC_ARENA_MAX": str(runtime.EMBEDDER_MALLOC_ARENA_MAX)}),
                "TOKENIZERS_PARALLELISM": "true",
                "RAYON_NUM_THREADS": str(embedder_ingest_threads),
            },
        ),
        replica(
            "retriever",
            ret_lines,
            ret,
            ret.faiss_threads,
            first_order + 1,
            growth=index + n * 56 + ret.sqlite_cache_bytes,
            contents=ContentsPlan(
                per_chunk_bytes=index // n + 56, cache_bytes=ret.sqlite_cache_bytes, capacity_chunks=n
            ),
        ),
        replica(
            "gateway",
            gw_lines,
            gw,
            1,
            first_order + 2,
            growth=2 * gw.max_body_bytes + runtime.GATEWAY_TRAFFIC_GROWTH + extraction_growth,
            copies=gw.replicas,
        ),
        *(
            [_wake_coordinator(replica(WAKE_COORDINATOR, _WAKE_COORDINATOR_LINES, gw, 1, first_order + 2))]
            if any(chat.on_demand for _, chat in profile.chat_engines())
            else []
        ),
    ]


WAKE_COORDINATOR = "wake_coordinator"
_WAKE_COORDINATOR_LINES = {"runtime (Serve replica, wake ledger)": runtime.WAKE_COORDINATOR_RUNTIME}


# Every call is async and cheap but ensure_awake, which waits up to a wake's timeout: Serve's default of 5
# calls at a time would queue every other engine's request_ended and /v1/models behind five waiting wakes.
WAKE_COORDINATOR_MAX_ONGOING_CALLS = 4096


def _wake_coordinator(replica: ReplicaPlan) -> ReplicaPlan:
    """Issue 48: the pool's one wake coordinator, on the gateway's node; it reserves no CPU (it only decides
    and waits on the engines), so it takes none from the engines' share."""
    options = replica.ray_actor_options.model_copy(update={"num_cpus": 0.0})
    serve = replica.serve.model_copy(update={"max_ongoing_requests": WAKE_COORDINATOR_MAX_ONGOING_CALLS})
    return replica.model_copy(update={"kind": WAKE_COORDINATOR, "ray_actor_options": options, "serve": serve})


def _ray_plan(profile: Profile, cpus: float, replicas: list[ReplicaPlan], head: bool = True) -> RayPlan:
    lines = nodes.ray_system_lines(head)
    if profile.ray.include_dashboard and head:
        lines["dashboard"] = runtime.RAY_DASHBOARD
    store = max(profile.ray.object_store_memory, runtime.RAY_OBJECT_STORE_MIN)
    lines["object_store"] = store
    return RayPlan(
        object_store_memory=store,
        include_dashboard=profile.ray.include_dashboard and head,
        num_cpus=cpus,
        memory=sum(r.ray_actor_options.memory * r.num_replicas for r in replicas),
        breakdown=lines,
    )


def _pools_for(profile: Profile, pool_total_bytes: int | None) -> list[tuple[PoolSpec, int, float]]:
    """(spec, total, cpus) of every pool; pool_total_bytes overrides the first. Every `node:` must name one."""
    names = [p.name for p in profile.pools]
    if len(set(names)) != len(names):
        raise PlanError(f"pools name a node twice: {', '.join(names)}")
    for section in (profile.chat, *profile.engines, profile.embedder, profile.retriever):
        for node in [section.node, *getattr(section, "nodes", [])]:
            if node and node not in names:
                raise PlanError(f"{node!r} names no pool; pools: {', '.join(sorted(names))}")
    pools = []
    for index, spec in enumerate(profile.pools):
        discrete = spec.gpu and not spec.unified
        if index and spec.total == "auto":
            raise PlanError(
                f"pool {spec.name}: total auto is read on this machine, which is the first node; "
                "set the size of every other node's pool"
            )
        detect = detect_gpu_bytes if discrete else detect_total_bytes
        total = (pool_total_bytes if index == 0 else None) or (detect() if spec.total == "auto" else spec.total)
        cpus = float(os.cpu_count() or 1) if spec.cpus == "auto" else float(spec.cpus)
        pools.append((spec, total, cpus))
    return pools


def _home(section, first: str) -> str:
    """The pool a replica lives on: its first `nodes`, else its `node`, else the first pool."""
    return (getattr(section, "nodes", None) or [None])[0] or section.node or first


def _engine_replicas(
    name: str, chat, eng, pools: dict, home: str, order: int, share_of: int = 1
) -> tuple[list[ReplicaPlan], list[str]]:
    """One engine's replica, and on a split engine (pipeline x tensor ranks) one share per further node; with
    the notes of its split. `share_of`: an on-demand engine's GPU share is its awake bytes' share of the pool
    divided by the pool's count of on-demand engines (issue 48): Ray places every engine's replica at start,
    asleep or not, and only the awake set must fit the memory, so the shares of all of them together stay
    within the one GPU (their sum is at most the largest engine's, which the plan's awake set holds)."""
    home_spec = pools[home][0]
    if chat.pipeline_parallel_size * chat.tensor_parallel_size == 1:
        split = None
        gb10_lines = gb10.overhead_lines(eng.breakdown) if home_spec.gpu and home_spec.unified else {}
        lines_by_node = {home: {**eng.breakdown, **gb10_lines}}
    else:
        split = split_engine(name, chat, eng, home, pools)
        lines_by_node = split.lines_by_node
    replicas = []
    for node_rank, (node, lines) in enumerate(lines_by_node.items()):
        spec, total, _ = pools[node]
        discrete = spec.gpu and not spec.unified
        device, host = split_device_lines(lines) if discrete else (lines, {})
        chat_bytes, host_bytes = sum(device.values()), sum(host.values())
        opts = RayActorOptions(
            num_cpus=chat.num_cpus,
            memory=host_bytes if discrete else chat_bytes,
            num_gpus=gpu_fraction(chat_bytes, total * share_of) if spec.gpu else None,
            resources=nodes.placement_resources(node) if len(pools) > 1 else None,
        )
        launch = engine_launch(
            name,
            eng,
            split,
            EngineNode(spec=spec, total=total, device_bytes=chat_bytes, num_gpus=opts.num_gpus, home=node == home),
        )
        growth = released_at_rest(device) if discrete else 0 if node != home else runtime.VLLM_TRAFFIC_GROWTH
        cpu_share = split is not None and split.over_cpu_nodes and node != home
        replicas.append(
            ReplicaPlan(
                name=name if node == home else f"{name}@{node}",
                kind="chat",
                node=node if len(pools) > 1 else "local",
                planned_bytes=chat_bytes,
                breakdown=device,
                host_bytes=host_bytes,
                host_breakdown=host,
                vllm=launch.args,
                ray_actor_options=opts,
                env=launch.env,
                start_order=order,
                growth_bytes=growth,
                serve=chat.serve,
                engine_node_rank=node_rank if cpu_share else None,
            )
        )
    return replicas, [split.note] if split else []


def build_plan(
    profile: Profile, pool_total_bytes: int | None = None, advise: bool = True, cpu_native_bf16: bool | None = None
) -> Plan:
    """advise=False: an overcommit raises a bare Overcommit (advice re-plans through this).
    cpu_native_bf16: whether this host's CPU computes bfloat16 (`dtype: auto` on a CPU pool); None reads it."""
    if cpu_native_bf16 is None:
        cpu_native_bf16 = detect_cpu_native_bf16()
    # The advice's re-plans are for this same host: /proc/cpuinfo is read once.
    replan = functools.partial(build_plan, advise=False, cpu_native_bf16=cpu_native_bf16) if advise else None
    listed = _pools_for(profile, pool_total_bytes)
    pools = {spec.name: (spec, total, cpus) for spec, total, cpus in listed}
    multi = len(listed) > 1
    first = listed[0][0].name
    other_threads = profile.embedder.torch_threads
    engines, engine_replicas, engine_notes = {}, [], []
    order = -1
    for name, chat in profile.chat_engines():
        home = _home(chat, first)
        spec, total, cpus = pools[home]
        order = max(order, 0) if spec.engines_together else order + 1  # engines that start together share one
        try:
            eng = plan_engine(chat, spec, cpus, total, other_threads, cpu_native_bf16)
        except (EngineError, ArchitectureError) as exc:
            raise PlanError(f"{name}: {exc}" if name != "chat" else str(exc)) from exc
        share_of = sum(1 for _, c in profile.chat_engines() if c.on_demand) if chat.on_demand else 1
        replicas, split_notes = _engine_replicas(name, chat, eng, pools, home, order, share_of)
        engine_replicas += replicas
        engines[name] = (chat, eng)
        engine_notes += [*eng.notes, *split_notes]
    eng = engines["chat"][1]
    emb_spec, emb_total, emb_cpus = pools[_home(profile.embedder, first)]
    dim = embedder_dimension(profile)  # the embedder's config.json, read once
    ingest_threads = _embedder_ingest_threads(profile, emb_spec, emb_cpus)
    side = _side_replicas(
        profile,
        emb_spec.gpu,
        dim,
        order + 1,
        pool_bytes=emb_total,
        embedder_ingest_threads=ingest_threads,
        discrete=emb_spec.gpu and not emb_spec.unified,
    )
    for r in side:
        # the gateway and the wake coordinator: the head
        node = first if r.kind in ("gateway", WAKE_COORDINATOR) else _home(getattr(profile, r.kind), first)
        spec, total, _ = pools[node]
        if spec.gpu and not spec.unified:
            r = _on_device(r, total)
        if multi:
            r = r.model_copy(
                update={
                    "node": node,
                    "ray_actor_options": r.ray_actor_options.model_copy(
                        update={"resources": nodes.placement_resources(node)}
                    ),
                }
            )
        engine_replicas.append(r)
    replicas = engine_replicas
    node_of = {r.name: (r.node if multi else first) for r in replicas}
    shares = [r for r in replicas if "@" in r.name]
    deployed = [r for r in replicas if "@" not in r.name]
    node_plans = {}
    for spec, total, cpus in listed:
        mine = [r for r in replicas if node_of[r.name] == spec.name]
        mine_engines = {n: e for n, e in engines.items() if node_of[n] == spec.name}
        node_plans[spec.name] = _node_plan(
            profile,
            spec,
            total,
            cpus,
            mine,
            mine_engines,
            engines,
            head=spec.name == first,
            replan=replan,
            multi=multi,
            override=pool_total_bytes,
        )
    pool, ray, admission, page_cache, start, notes, demand = node_plans[first]
    notes = engine_notes + [n for _, _, _, _, _, node_notes, _ in node_plans.values() for n in node_notes]
    facts = {
        name: ChatFacts(
            **{k: v for k, v in e.facts.items() if k in ChatFacts.model_fields}, architecture_source=e.arch.source
        )
        for name, (_, e) in engines.items()
    }
    if multi:
        pool_list = [p for p, *_ in node_plans.values()]
    else:
        pool_list = [pool]
    spec, _, cpus = listed[0]
    return Plan(
        profile=profile.name,
        profile_digest=profile_digest(profile),
        pool=pool,
        pools=pool_list,
        replicas=deployed,
        shares=shares,
        chat=facts["chat"],
        engines=facts,
        ray=ray,
        admission=admission,
        threads={
            "cpus": int(cpus),
            "chat_omp": eng.facts["omp_threads"],
            "chat_decode_omp": eng.facts["decode_omp_threads"],
            "embedder_torch": profile.embedder.torch_threads,
            "embedder_ingest_most": ingest_threads,
            "faiss": profile.retriever.faiss_threads,
            "gateway": 1,
        },
        page_cache=page_cache,
        start_peak=start,
        notes=notes,
        gateway=_gateway_settings(profile, deployed),
        edge=GatewayEdge(
            state_dir=profile.state_dir,
            tenants_file=profile.tenants_file,
            gateway=profile.gateway,
            guard=guard_plan(spec, pool.total_bytes, pool.free_bytes - pool.headroom_bytes, pool.discrete),
        ),
        embedder=_embedder_settings(profile, deployed, ingest_threads),
        retriever=_retriever_settings(profile, dim),
        on_demand=demand.section,
    )


def _node_plan(
    profile: Profile,
    spec: PoolSpec,
    total: int,
    cpus: float,
    replicas: list[ReplicaPlan],
    engines: dict,
    all_engines: dict,
    head: bool,
    replan,
    multi: bool,
    override: int | None,
):
    """One node's pool: its replicas, Ray's processes there, its page cache, admission in start order.
    replan: build_plan without advice, for the advice an overcommit gets; None: raise a bare Overcommit."""
    discrete = spec.gpu and not spec.unified
    free = total - spec.reserve
    ray = _ray_plan(profile, cpus, replicas, head=head)
    # Ray's own processes and object store are host memory beside a discrete GPU, not in its pool.
    ray_bytes = 0 if discrete else sum(ray.breakdown.values())
    page_cache = {
        f"page_cache.{name}.{c} (on disk, {gib(b)})": chat.disk_page_cache_bytes
        for name, (chat, e) in engines.items()
        for c, b in e.disk_components.items()
    }
    starts = {name: _start_lines(name, chat, e, spec) for name, (chat, e) in engines.items()}
    # issue 48: on-demand engines count asleep, but for the worst awake set; they start asleep (no admission row)
    demand = on_demand_pool(profile, spec, total, replicas, starts, ray_bytes + sum(page_cache.values()), multi)
    needed = sum(r.pool_bytes for r in replicas) + ray_bytes + sum(page_cache.values()) + demand.adjust_bytes
    if needed > free:
        where = f"node {spec.name} is short by" if multi else "short by"
        if replan is None:
            raise Overcommit(f"{where} {gib(needed - free)}", needed, free)
        eng = (all_engines.get("chat") or next(iter(all_engines.values())))[1]
        raise PlanError(
            overcommit_message(
                profile,
                spec,
                total,
                free,
                replicas,
                ray.breakdown,
                page_cache,
                eng,
                replan=replan,
                nodes=[p.name for p in profile.pools] if multi else None,
                override=override,
            )
        )
    want_cpus = sum(r.ray_actor_options.num_cpus * r.num_replicas for r in replicas)
    if want_cpus > cpus:
        raise PlanError(
            f"replicas ask for {want_cpus:g} Ray CPUs but pool {spec.name} has {cpus:g}: lower the "
            "num_cpus of chat/embedder/retriever/gateway (fractions are fine)"
        )
    notes: list[str] = list(demand.notes)
    admission = _admission(
        [r for r in replicas if r.name not in demand.engines],
        total,
        spec,
        ray_bytes + sum(page_cache.values()),
        notes,
        starts,
        discrete,
    )
    admission += [Admission(**row) for row in demand.wake_rows]  # issue 48: each on-demand engine's wake
    if multi:
        notes = [f"node {spec.name}: {n}" for n in notes]
    # Headroom at start: the tightest moment of the start order (an engine at its start peak).
    tightest = min((a.start_headroom_bytes for a in admission), default=free - needed)
    engine_rows = [a for a in admission if a.name in starts]
    start = starts[min(engine_rows, key=lambda a: a.start_headroom_bytes).name] if engine_rows else {}
    pool = PoolPlan(
        name=spec.name,
        total_bytes=total,
        reserve_bytes=spec.reserve,
        free_bytes=free,
        cpus=cpus,
        gpu=spec.gpu,
        unified=spec.gpu and spec.unified,
        discrete=discrete,
        # issue 48: sleeping engines' level-1 weights wait in host memory, beside the device's pool
        host_bytes=sum(r.host_bytes * r.num_replicas for r in replicas)
        + sum(ray.breakdown.values())
        + (demand.section.asleep_host_bytes_most if demand.section else 0)
        if discrete
        else 0,
        planned_bytes=needed - ray_bytes - sum(page_cache.values()),
        ray_bytes=ray_bytes,
        page_cache_bytes=sum(page_cache.values()),
        headroom_bytes=free - needed,
        start_peak_bytes=sum(start.values()),
        start_headroom_bytes=min(free - needed, tightest),
        needed_bytes=needed + max((a.start_peak_bytes for a in admission), default=0) + spec.reserve,
    )
    if multi:
        pool = pool.model_copy(
            update={
                "head": head,
                "replicas": [r.name for r in replicas],
                "ray_breakdown": ray.breakdown,
                "admission": admission,
                "start_peak": start,
                "page_cache": page_cache,
                "ray_resources": nodes.advertised_resources(spec.name),
            }
        )
    return pool, ray, admission, page_cache, start, notes, demand


def _on_device(replica: ReplicaPlan, total: int) -> ReplicaPlan:
    """A side replica on a discrete GPU: its device lines are its share of the pool (none for the retriever
    and gateway, whose FAISS and HTTP work stays on the CPU), the rest is host memory."""
    device, host = split_device_lines(replica.breakdown)
    device_bytes, host_bytes = sum(device.values()), sum(host.values())
    options = replica.ray_actor_options.model_copy(
        update={"memory": host_bytes, "num_gpus": gpu_fraction(device_bytes, total) if device_bytes else None}
    )
    return replica.model_copy(
        update={
            "planned_bytes": device_bytes,
            "breakdown": device,
            "host_bytes": host_bytes,
            "host_breakdown": host,
            "growth_bytes": released_at_rest(device),
            "ray_actor_options": options,
        }
    )


def _embedder_ingest_threads(profile: Profile, spec: PoolSpec, cpus: float) -> int:
    """The most threads a document batch may borrow (EmbedderSpec.ingest_threads): the pool's CPUs on a CPU
    pool; on a GPU, where the forward pass is the device's and tokenizing is the CPU's share of an ingest,
    half of them (the rest stay the engine's and the gateway's)."""
    emb = profile.embedder
    default = max(1, int(cpus) // 2) if spec.gpu else int(cpus)
    return max(emb.torch_threads, emb.ingest_threads or default)


def _embedder_settings(profile: Profile, replicas: list[ReplicaPlan], ingest_threads: int) -> EmbedderSettings:
    emb = profile.embedder
    options = next(r for r in replicas if r.name == "embedder").ray_actor_options
    return EmbedderSettings(
        model_path=str(emb.model),
        model_id=emb.model_id,
        batch_size=emb.batch_size,
        chunk_tokens=profile.rag.chunk_tokens,
        chunk_overlap=profile.rag.chunk_overlap,
        torch_threads=emb.torch_threads,
        ingest_threads=ingest_threads,
        device=torch_device(options.num_gpus),
        query_prefix=emb.query_prefix,
        cpu_nice=emb.cpu_nice,
        question_window_s=emb.question_window_s,
    )


def _retriever_settings(profile: Profile, dim: int) -> RetrieverSettings:
    ret = profile.retriever
    return RetrieverSettings(
        state_dir=profile.state_dir,
        dim=dim,
        index_kind=ret.index,
        embedder_model_id=profile.embedder.model_id,
        fusion=profile.rag.fusion,
        **ret.model_dump(
            include={
                "hnsw_m",
                "hnsw_ef_search",
                "faiss_threads",
                "capacity_chunks",
                "sqlite_cache_bytes",
                "tenant_max_chunks",
                "tenant_max_documents",
                "tenant_quotas",
                "hnsw_rebuild_deleted_fraction",
                "index_save_interval_s",
            }
        ),
    )


def _gateway_settings(profile: Profile, replicas: list[ReplicaPlan]) -> GatewaySettings:
    by_name = {r.name: r for r in replicas}
    cards = {
        spec.model_id: ChatModelCard(
            path=spec.model,
            max_model_len=by_name[name].vllm.max_model_len,
            replica=name,
            on_demand=spec.on_demand is not None,
        )
        for name, spec in profile.chat_engines()
    }
    limits = profile.gateway.model_dump(include=set(FROM_GATEWAY_SPEC))
    return GatewaySettings(
        **profile.rag.model_dump(),
        **limits,
        chat_model_id=profile.chat.model_id,
        chat_models=cards,
        embed_model_id=profile.embedder.model_id,
        embed_max_seq_tokens=profile.embedder.max_seq_tokens,
        state_dir=profile.state_dir,
        planned_bytes={r.name: r.planned_bytes for r in replicas},
        planned_at_rest_bytes={r.name: r.planned_bytes - r.growth_bytes for r in replicas},
        planned_contents={r.name: r.contents for r in replicas if r.contents is not None},
    )


def _start_lines(name: str, chat, eng, spec: PoolSpec) -> dict[str, int]:
    """An engine's start-up transient, beyond its steady lines (runtime.START_*): its checkpoint in the
    page cache while it is copied, and compile / graph capture when not eager (a speculator's capture on
    a unified GPU pool as measured on a GB10, runtime.GB10_SPECULATOR_GRAPH_CAPTURE). Beside a discrete
    GPU the page cache and the compile workers are host memory: only graph capture touches the device."""
    discrete = spec.gpu and not spec.unified
    weights = eng.facts["weight_bytes"] + eng.facts["drafter_weight_bytes"]
    lines = (
        {}
        if discrete or chat.load_format == "dummy"
        else {f"start.{name}.weights_page_cache": min(runtime.START_WEIGHT_READ, weights)}
    )
    if not chat.enforce_eager:
        if not discrete:
            lines[f"start.{name}.compile"] = runtime.START_COMPILE
        if spec.gpu and spec.unified and eng.drafter.method != "none":
            lines[f"start.{name}.speculator_graph_capture (GB10)"] = gb10.speculator_capture_peak()
        else:
            lines[f"start.{name}.cuda_graph_capture"] = runtime.START_GRAPH_CAPTURE
    return lines


def _admission(
    replicas: list[ReplicaPlan],
    total: int,
    spec: PoolSpec,
    outside: int,
    notes: list[str],
    starts: dict[str, dict[str, int]] | None = None,
    discrete: bool = False,
) -> list[Admission]:
    """Replicas start in start order, those of one order side by side (CPU engines: PoolSpec.engines_start);
    vLLM refuses util x total > free (GPU) or KV > MemAvailable (CPU). A replica's companions of the same order
    are counted as started, and their start peaks beside its own. Reads the replicas only: a plan is never
    edited by its admission check."""
    rows = []
    base = total - spec.reserve - outside
    started = 0
    everyone = sum(r.pool_bytes for r in replicas)
    wave_bytes, wave_peak = defaultdict(int), defaultdict(int)
    for r in replicas:
        wave_bytes[r.start_order] += r.pool_bytes
        wave_peak[r.start_order] += sum((starts or {}).get(r.name, {}).values())
    order = None
    for r in sorted(replicas, key=lambda r: r.start_order):
        if order is not None and r.start_order != order:
            started += wave_bytes[order]
        order = r.start_order
        free_before = base - started - (wave_bytes[order] - r.pool_bytes)
        worst = base - (everyone - r.pool_bytes)
        overhead = 0
        if r.kind == "chat" and spec.gpu:
            util = r.vllm.gpu_memory_utilization
            # Unified memory: the engine's host processes are in the pool too. A discrete GPU holds only the
            # worker's CUDA context when vLLM samples free memory.
            overhead = runtime.CUDA_CONTEXT if discrete else runtime.VLLM_GPU_START_OVERHEAD
            requested = int(util * total)
            check = f"util {util} x total <= free - {gib(overhead)} of its own start-up (sampled after it)"
        elif r.kind == "chat" and r.vllm is None:  # a split engine's ranks on another node: their share
            requested, check = r.pool_bytes, "the ranks' planned bytes <= free"
        elif r.kind == "chat":
            requested, check = r.vllm.kv_cache_memory_bytes, "kv_cache_memory_bytes <= MemAvailable"
        else:
            requested, check = r.pool_bytes, "planned bytes <= free"
        # A start that would be refused is a PlanError: every Admission in a Plan passes.
        if requested > free_before - overhead:
            raise PlanError(
                f"{r.name} would be refused at start: {check} fails ({gib(requested)} requested, "
                f"{gib(free_before)} free at its turn, {gib(free_before - overhead)} when vLLM looks)"
            )
        peak = sum((starts or {}).get(r.name, {}).values())
        beside = wave_peak[order] - peak  # the start peaks of the engines starting with it
        if free_before - r.pool_bytes < peak + beside:
            raise PlanError(
                f"{r.name} would run out while it starts: {gib(free_before)} free at its turn, "
                f"{gib(r.pool_bytes)} planned + {gib(peak)} start peak ({', '.join(starts[r.name])})"
                + (f" + {gib(beside)} of the engines starting beside it" if beside else "")
            )
        if requested > worst - overhead:
            notes.append(f"{r.name}: admission needs start order (passes only if started before the others)")
        rows.append(
            Admission(
                name=r.name,
                start_order=r.start_order,
                free_before_bytes=free_before,
                free_worst_bytes=worst,
                requested_bytes=requested,
                overhead_bytes=overhead,
                start_peak_bytes=peak,
                start_headroom_bytes=free_before - r.pool_bytes - peak - beside,
                check=check,
            )
        )
    return rows


__all__ = [
    "Plan",
    "PlanError",
    "ReplicaPlan",
    "PoolPlan",
    "ChatFacts",
    "RayPlan",
    "Admission",
    "build_plan",
    "detect_total_bytes",
    "embedder_dimension",
    "pinned",
]
