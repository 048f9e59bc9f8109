"""The profile schema: one pydantic model that is the source of every number the stack runs with.

A profile says what to host and how hard it will be used; `planner.plan` turns it into bytes,
vLLM arguments and Ray resources. Sizes accept bytes or strings such as "1GiB" / "512MB".
Relative paths are resolved against the directory the profile is loaded from (the project root
when it lives in `configs/`), so Ray replicas, whose working directory differs, get absolute paths.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from planner.on_demand_spec import OnDemandSpec
from planner.profile_file import read_profile_data

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_size(value: int | float | str) -> int:
    """'1.5GiB' -> 1610612736; plain numbers are bytes."""
    if isinstance(value, bool):
        raise ValueError("a size must be a number of bytes or a string like '4GiB'")
    if isinstance(value, (int, float)):
        return int(value)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"cannot read size {value!r}: use bytes or e.g. '512MiB', '4GiB', '186GB'")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def _size_or_auto(value):
    return value if value == "auto" or value is None else parse_size(value)


Size = Annotated[int, BeforeValidator(parse_size)]
SizeOrAuto = Annotated[int | Literal["auto"], BeforeValidator(_size_or_auto)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class ServeSpec(_Strict):
    """A replica's Ray Serve deployment options (the plan copies them into every deployment)."""

    max_ongoing_requests: int = Field(
        ge=1,
        description="Requests one replica takes at once; Serve queues the "
        "rest at the caller (the gateway's are all of the stack's HTTP requests).",
    )
    health_check_period_s: float = Field(10.0, gt=0, description="How often Serve checks the replica.")
    health_check_timeout_s: float = Field(
        30.0, gt=0, description="A check that takes longer fails; a replica that fails is restarted."
    )
    start_wait_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="How long the replica's constructor waits for the "
        "replicas before it in the start order (deployments/start_order.py): an engine's "
        "start takes 45-110 s on 2 cores, a GB10 loading 100 GB more.",
    )

    def deployment_options(self) -> dict:
        """The options Ray Serve's deployment takes (the start wait is poolserve's own)."""
        return self.model_dump(exclude={"start_wait_timeout_s"})


def _serve(max_ongoing_requests: int, health_check_timeout_s: float = 30.0, health_check_period_s: float = 10.0):
    return Field(
        default_factory=lambda: ServeSpec(
            max_ongoing_requests=max_ongoing_requests,
            health_check_timeout_s=health_check_timeout_s,
            health_check_period_s=health_check_period_s,
        ),
        description="Ray Serve options of this replica.",
    )


# Ports from VLLM_PORT on that vLLM's message queues may take on one node (one per queue it opens there;
# vllm/utils/network_utils.py get_open_port counts up from VLLM_PORT past busy ones).
VLLM_PORT_SPAN = 16


class RayPortsSpec(_Strict):
    """The ports one node's Ray processes listen on when the profile has several nodes: fixed, so that the
    firewall between the nodes can name them (docs/SPARK.md "Two Sparks"). One node picks free loopback ports."""

    gcs: int = Field(6379, ge=1, le=65535, description="The head's GCS (`ray start --port`): where nodes join.")
    ray_client_server: int = Field(10001, ge=1, le=65535, description="Head only: Ray's client server.")
    dashboard: int = Field(8265, ge=1, le=65535, description="Head only: the dashboard head (bound to loopback).")
    dashboard_agent_listen: int = Field(52365, ge=1, le=65535, description="Every node: the dashboard agent's HTTP.")
    dashboard_agent_grpc: int = Field(52366, ge=1, le=65535, description="Every node: the dashboard agent's gRPC.")
    metrics_export: int = Field(52367, ge=1, le=65535, description="Every node: the metrics agent.")
    runtime_env_agent: int = Field(52368, ge=1, le=65535, description="Every node: the runtime-env agent.")
    node_manager: int = Field(
        52369,
        ge=1,
        le=65535,
        description="Every node: its raylet (a joining node: the first port of node_manager_span).",
    )
    node_manager_span: int = Field(
        4,
        ge=1,
        le=64,
        description="A joining node's raylet takes the next port of "
        "node_manager .. node_manager + span - 1 each time it joins: the head's gRPC "
        "channel to the node's previous raylet, in reconnect back-off, is then never "
        "reused (seen here: a node back on the same port got no placement for minutes).",
    )
    object_manager: int = Field(52370, ge=1, le=65535, description="Every node: its object manager.")
    min_worker: int = Field(52400, ge=1, le=65535, description="Every node: the first port of its worker processes.")
    max_worker: int = Field(52599, ge=1, le=65535, description="Every node: the last port of its worker processes.")
    vllm_master: int = Field(
        29500,
        ge=1,
        le=65535,
        description="A CPU chat engine split over nodes, on its first "
        "node: torch.distributed's rendezvous (vLLM master_port).",
    )
    vllm_ports: int = Field(
        29510,
        ge=1,
        le=65535,
        description="A CPU chat engine split over nodes, on each of its "
        "nodes: the first of VLLM_PORT_SPAN ports vLLM's message queues between the nodes take "
        "(VLLM_PORT; vLLM tries it, then the next ones).",
    )

    @model_validator(mode="after")
    def _worker_range(self) -> "RayPortsSpec":
        if self.min_worker > self.max_worker:
            raise ValueError(f"ray_ports: min_worker {self.min_worker} is above max_worker {self.max_worker}")
        return self

    def listening(self, head: bool) -> set[int]:
        """Every port this node listens on (a range counts each port)."""
        single = {
            self.dashboard_agent_listen,
            self.dashboard_agent_grpc,
            self.metrics_export,
            self.runtime_env_agent,
            self.object_manager,
            *range(self.node_manager, self.node_manager + self.node_manager_span),
            self.vllm_master,
            *range(self.vllm_ports, self.vllm_ports + VLLM_PORT_SPAN),
        }
        if head:
            single |= {self.gcs, self.ray_client_server, self.dashboard}
        return single | set(range(self.min_worker, self.max_worker + 1))


class PoolSpec(_Strict):
    """One node's memory pool (unified memory: CPU and GPU share it)."""

    name: str = Field("local", description="Node name; replicas are placed per node.")
    address: str = Field(
        "127.0.0.1",
        description="Several nodes: this node's address on the link between them "
        "(a Spark's QSFP port), which Ray registers the node under; not 127.0.0.1, which Ray "
        "swaps for the machine's address. One node: ignored (loopback, always).",
    )
    ray_ports: RayPortsSpec = Field(
        default_factory=RayPortsSpec,
        description="Several nodes: this node's fixed Ray "
        "ports (the first pool is the head). Two nodes on one address need disjoint ones.",
    )
    total: SizeOrAuto = Field(
        "auto", description="Pool size: bytes, '186GB', or 'auto' (MemTotal, or the GPU's memory)."
    )
    reserve: Size = Field(
        parse_size("3GiB"), description="Kept free for the OS, page cache and runtimes outside the plan."
    )
    cpus: float | Literal["auto"] = Field(
        "auto", description="CPU cores the plan may hand out; 'auto' = os.cpu_count()."
    )
    chat_cores: str | None = Field(
        None,
        description="A CPU chat engine split over nodes: the cores this node's "
        "ranks compute on (VLLM_CPU_OMP_THREADS_BIND, e.g. '1' or '0-3'); None = the "
        "engine's own binding. Nodes that share one machine name disjoint cores: bound "
        "to the same core, the ranks' hand-offs spin against each other.",
    )
    gpu: bool = Field(False, description="True when replicas run on a GPU that shares this pool.")
    unified: bool = Field(
        True,
        description="True when CPU and GPU share one memory (DGX Spark, GH200); "
        "False for a discrete GPU, whose device memory is then the pool.",
    )
    engines_start: Literal["auto", "one_at_a_time", "together"] = Field(
        "auto",
        description="How this pool's chat engines start: one at a time (each after the one before has "
        "allocated its KV cache and answered its warm-up) or together; the other replicas start after them either "
        "way. auto: one at a time on a GPU, whose start check counts a neighbour's loading as used (vllm#55827); "
        "together on a CPU, where vLLM sizes the KV cache from kv_cache_memory_bytes and checks nothing, and a "
        "start is mostly one process at a time importing vLLM, so starts side by side use the idle cores.",
    )
    cgroup: bool = Field(
        False,
        description="Run the whole stack inside a memory cgroup of `total` bytes: a real "
        "pool on a machine without unified memory (needs root or a delegated cgroup).",
    )
    shed_ingest_at: float = Field(
        0.90,
        gt=0,
        lt=1,
        description="Pool guard: above this fraction of the pool in "
        "use (not reclaimable), new ingestion gets 503 + Retry-After.",
    )
    shed_all_at: float = Field(
        0.95,
        gt=0,
        lt=1,
        description="Pool guard: above this fraction, every new "
        "generation, embedding and ingestion gets 503 + Retry-After.",
    )
    shed_ingest_headroom_share: float = Field(
        0.5,
        ge=0,
        lt=1,
        description="Pool guard: ingestion is shed only "
        "once use passes the plan's own bytes plus this share of the headroom "
        "the plan leaves (pool - planned), if that is above shed_ingest_at: a "
        "GPU is as full at rest as its plan, which is no reason to shed.",
    )
    shed_all_headroom_share: float = Field(
        0.75, ge=0, lt=1, description="Pool guard: likewise for all new work (the higher of this and shed_all_at)."
    )
    shed_hysteresis: float = Field(
        0.03,
        gt=0,
        lt=0.5,
        description="Pool guard: shedding stops once use falls "
        "this fraction below the mark that started it (no flapping at the mark).",
    )
    shed_sample_interval_s: float = Field(
        0.25,
        gt=0,
        description="Pool guard: the pool's use is read at most "
        "this often (a cgroup or /proc/meminfo read per request otherwise).",
    )
    shed_retry_after_s: int = Field(
        5,
        ge=1,
        description="Pool guard: Retry-After of a shed request; shorter than "
        "a replica's restart (gateway.unavailable_retry_after_s): memory frees in seconds.",
    )
    shed_heaviest_at_least: int = Field(
        2,
        ge=1,
        description="Pool guard: past shed_ingest_at, new work of the "
        "tenant with the most requests in flight (this many at least, and more than "
        "any other tenant) is refused too: shedding starts with whoever grows the pool.",
    )
    # --- issue 48: on-demand engines (planner/on_demand_pool.py); left out of the dump when unset ---
    max_awake_on_demand: int | None = Field(
        None,
        ge=0,
        exclude_if=lambda v: v is None,
        description="The most "
        "on-demand chat engines of this pool awake at once; the plan holds the "
        "largest such set by bytes. None = all of them.",
    )

    @property
    def engines_together(self) -> bool:
        return self.engines_start == "together" or (self.engines_start == "auto" and not self.gpu)

    @model_validator(mode="after")
    def _marks_in_order(self) -> "PoolSpec":
        if self.shed_ingest_at > self.shed_all_at:
            raise ValueError(
                f"shed_ingest_at ({self.shed_ingest_at}) must not be above shed_all_at "
                f"({self.shed_all_at}): ingestion is shed first"
            )
        if self.shed_ingest_headroom_share > self.shed_all_headroom_share:
            raise ValueError(
                f"shed_ingest_headroom_share ({self.shed_ingest_headroom_share}) must not be above "
                f"shed_all_headroom_share ({self.shed_all_headroom_share}): ingestion is shed first"
            )
        return self


class HubSource(_Strict):
    """A Hugging Face repo at a revision: where `poolserve fetch` downloads a model folder from."""

    repo_id: str = Field(
        ...,
        pattern=r"^(?:[\w.-]+/)?[\w.-]+$",
        description="Hugging Face repo id: 'org/name' (or a legacy id without an org).",
    )
    revision: str = Field(
        ...,
        min_length=1,
        description="Branch, tag or commit to fetch. A 40-hex commit pins "
        "the bytes; a branch is resolved to its commit once, so config and weights match.",
    )


class SpeculativeSpec(_Strict):
    """Speculative decoding; its bytes come out of the chat engine's budget."""

    method: Literal["none", "ngram", "draft_model", "dspark", "mtp", "eagle", "eagle3"] = Field(
        "none", description="vLLM speculative method, or none."
    )
    model: str | None = Field(None, description="Draft model folder (draft_model, dspark, eagle).")
    architecture: str | None = Field(
        None, description="Bundled configs/models/<name>.json for a draft folder that is not on this machine."
    )
    hub: HubSource | None = Field(
        None,
        description="Hub repo `poolserve fetch` downloads the draft folder "
        "(`model`) from; None = the folder is provided locally.",
    )
    num_speculative_tokens: int = Field(3, ge=1, le=16, description="Tokens proposed per step.")
    prompt_lookup_min: int = Field(2, ge=1, description="ngram: shortest n-gram to match.")
    prompt_lookup_max: int = Field(4, ge=1, description="ngram: longest n-gram to match.")

    @model_validator(mode="after")
    def _hub_needs_a_folder(self) -> "SpeculativeSpec":
        if self.hub and not self.model:
            raise ValueError("speculative.hub needs speculative.model: the folder the draft is fetched into")
        return self


class ChatSpec(_Strict):
    """The vLLM chat engine."""

    model_id: str = Field(..., description="Name clients send as `model`.")
    model: str = Field(..., description="Model folder (config.json + weights), or a name under configs/models/.")
    architecture: str | None = Field(
        None,
        description="Name of bundled architecture facts (configs/models/<name>.json) "
        "used when the model folder is not on this machine.",
    )
    hub: HubSource | None = Field(
        None,
        description="Hub repo `poolserve fetch` downloads the model folder "
        "(`model`) from; None = the folder is provided locally.",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("bfloat16", description="Activation/weight dtype.")
    quantization: Literal["auto", "none", "fp8", "nvfp4", "int4", "awq", "int3", "mxfp4"] = Field(
        "auto", description="Weight format of the checkpoint; 'auto' reads config.json's quantization_config."
    )
    component_dtypes: dict[str, str] = Field(
        default_factory=dict, description="Per-component weight dtype overrides, e.g. {ple: int4, mtp: bfloat16}."
    )
    placement: dict[str, Literal["pool", "disk"]] = Field(
        default_factory=dict,
        description="Where a component lives: in the pool (resident) or on disk (mmap), e.g. {ple: disk}.",
    )
    disk_page_cache_bytes: Size = Field(
        parse_size("4GiB"),
        description="Page-cache headroom kept free for each component placed on disk (hot rows of an mmap'd table).",
    )
    kv_cache_dtype: Literal["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"] = Field(
        "auto", description="KV cache dtype; 'auto' = the model dtype. fp8 halves attention KV."
    )
    block_size: int | None = Field(
        None,
        ge=1,
        description="KV block in tokens; None = vLLM's default (128 on CPU, "
        "16 on GPU, raised for hybrids to cover one state page).",
    )
    mamba_cache_mode: Literal["auto", "none", "align"] = Field(
        "auto",
        description="Hybrid models: 'align' caches "
        "recurrent state at block boundaries (prefix caching); auto = align when prefix caching is on.",
    )
    mamba_ssm_cache_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Hybrid models: dtype of the recurrent (SSM/GDN) state; auto = the config's (often float32).",
    )
    enforce_eager: bool | None = Field(None, description="GPU: no CUDA graphs. CPU: no torch.compile (eager PyTorch).")
    cuda_graph_capture_sizes: list[int] | None = Field(
        None, description="Batch sizes to capture (GPU only; ignored on CPU)."
    )
    torch_compile: bool | None = Field(
        None,
        description="GPU: compile the model with torch.compile before its decode "
        "graphs are captured (vLLM's VLLM_COMPILE mode). None = the planner's choice: "
        "on for plain decoding and MTP, where it was measured (the 27B on an H100 decoded "
        "one stream at 0.81 of its HBM roofline compiled, 0.68 not; TTFT 94 against 197 "
        "ms at 256 prompt tokens; a first start 43 s longer: docs/GPU.md), off with the "
        "other drafters until measured. Ignored with enforce_eager and on CPU.",
    )
    gpu_memory_utilization: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Pin vLLM's utilization; None = the "
        "planner gives the engine exactly its planned bytes over the pool.",
    )
    activation_bytes: SizeOrAuto = Field(
        "auto", description="Activations for max_num_batched_tokens; auto = estimated."
    )
    expected_concurrency: int | None = Field(
        None,
        ge=1,
        description="Concurrent chat streams the profile is sized "
        "for (documentation; the plan checks max_num_seqs covers it).",
    )
    omp_bind: str = Field(
        "auto",
        description="VLLM_CPU_OMP_THREADS_BIND for the CPU engine: 'auto' (one core; with "
        "omp_threads > 1, the first omp_threads CPUs the host allows), 'nobind' or a core list.",
    )
    max_model_len: int = Field(4096, ge=64, description="Longest prompt + completion, in tokens.")
    max_num_seqs: int = Field(8, ge=1, description="Cap on sequences decoded together.")
    max_num_batched_tokens: int = Field(
        2048, ge=64, description="Chunked-prefill token budget per step (drives activations)."
    )
    kv_cache_bytes: SizeOrAuto = Field(
        "auto", description="KV pool; 'auto' sizes it for max_num_seqs x expected_tokens_per_seq."
    )
    expected_tokens_per_seq: int = Field(1024, ge=16, description="Typical prompt + answer length, for max_num_seqs.")
    enable_prefix_caching: bool = Field(True, description="Reuse KV of shared prompt prefixes (RAG system prompts).")
    num_cpus: float = Field(0.5, gt=0, description="Ray CPUs for the engine (fractional on small machines).")
    # 60 s: an engine busy with a long prefill answers its health check late, not never.
    # Every 2 s: a dead EngineCore leaves the replica's actor alive, and only this check (vLLM's reads a flag)
    # finds it; every 10 s made a restart wait 5 s on average before it began.
    serve: ServeSpec = _serve(256, health_check_timeout_s=60.0, health_check_period_s=2.0)
    omp_threads: int | None = Field(
        None,
        ge=1,
        description="OpenMP threads for the vLLM CPU worker's prefill steps; "
        "None = every CPU of the pool (a CPU engine of one rank), else the CPUs the "
        "embedder leaves (at most 4 on a GPU).",
    )
    decode_omp_threads: int | None = Field(
        None,
        ge=1,
        description="CPU: OpenMP threads for a step of fewer than "
        "wide_step_tokens tokens (decoding); None = the pool's CPUs less the "
        "embedder's threads, at most omp_threads.",
    )
    # 128: a decode step of the default's 16 sequences with 4 speculative tokens each schedules 80 tokens, a RAG
    # prompt 300-1,000 (docs/archive/BENCHMARKS-history.md, the old section 2d′).
    wide_step_tokens: int = Field(
        128,
        ge=1,
        description="CPU: a step of at least this many tokens (a prefill) runs "
        "on omp_threads, smaller ones on decode_omp_threads (vllm_bridge/cpu_worker.py).",
    )
    # 0.05 s: vLLM's Worker busy-waits (sched_yield) 1 s for its next step after each one, a core of two held
    # for a second after every request; with 0.05 s another tenant's chat p95 beside a bulk ingest went from
    # 1.1-7.9x quiet to 1.0-1.5x (docs/SECURITY.md), and a generation's steps still follow within it.
    worker_idle_spin_s: float = Field(
        0.05,
        ge=0,
        le=1.0,
        description="CPU: how long the vLLM Worker busy-waits for "
        "its next step after the last before it sleeps on its socket (vLLM: 1 s); "
        "vllm_bridge/cpu_worker.py.",
    )
    speculative: SpeculativeSpec = Field(default_factory=SpeculativeSpec, description="Speculative decoding.")
    warmup_prompt: str = Field("Say OK.", description="Sent once before the replica reports ready.")
    # Ray Serve LLM's 50 ms: on an H100 the 27B decodes a token every ~25 ms, so a stream arrived two tokens a
    # chunk (ITL p95 51 ms against raw vLLM's 25, docs/GPU.md); fewer chunks cost less CPU per token at 64 streams.
    stream_batching_interval_ms: float = Field(
        50.0,
        ge=0,
        le=1000,
        description="How long the chat replica "
        "gathers a stream's tokens into one chunk after the first (Ray "
        "Serve LLM's stream_batching_interval_ms); 0 = every engine output "
        "is its own chunk. The first output is never held.",
    )
    heap_trim_interval_s: float = Field(
        60.0,
        ge=0,
        description="How often the chat replica hands the freed heap "
        "of its vLLM Worker processes back to the pool (glibc malloc_trim through "
        "collective_rpc); 0 = never. Without it the Worker keeps ~200-400 MiB of "
        "freed heap under load (docs/STRESS.md, 'What grows in the vLLM Worker').",
    )
    onednn_primitive_cache: int | None = Field(
        0,
        ge=0,
        description="ONEDNN_PRIMITIVE_CACHE_CAPACITY for the CPU "
        "engine: oneDNN's process-wide cache of matmul primitives, one per "
        "batch size the scheduler produces (1,024 by default, each holding "
        "JIT code); vLLM keeps its own 32 per weight shape. 0 = vLLM's cache "
        "only; None = oneDNN's default (docs/STRESS.md, 'oneDNN's cache').",
    )
    load_format: Literal["auto", "dummy"] = Field(
        "auto",
        description="'dummy': random weights of the real "
        "architecture (vLLM's load_format), for plan validation and "
        "benchmarks on a machine without the checkpoint; never for "
        "answers. The plan still reads the real config.json.",
    )
    gdn_prefill_backend: Literal["auto", "triton", "flashinfer"] = Field(
        "auto",
        description="Hybrid GDN models: the prefill kernel (vLLM additional_config). vLLM 0.26 picks "
        "FlashInfer and dies at the first prefill where flashinfer is not installed; 'triton' uses the FLA "
        "kernel (docs/GPU.md).",
    )
    language_model_only: bool = Field(
        False,
        description="Multimodal checkpoints (Qwen3.5/3.8 "
        "ConditionalGeneration): accept no images or video, so vLLM plans no "
        "encoder cache or vision profiling (limit_mm_per_prompt 0).",
    )
    node: str | None = Field(None, description="Pool (node) name to place the replica on; None = the first.")
    pipeline_parallel_size: int = Field(
        1,
        ge=1,
        description="vLLM pipeline ranks: the decoder layers split "
        "over them (vLLM's get_pp_indices); works on CPU (planner/parallel.py).",
    )
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        description="vLLM tensor ranks: heads, MLP and vocabulary split "
        "over them; KV heads replicated when fewer than the ranks.",
    )
    nodes: list[str] = Field(
        default_factory=list,
        description="Pools the engine's ranks live on, in rank order "
        "(pipeline x tensor ranks spread evenly); empty = all on `node`. The first holds the "
        "replica, its scheduler and rank 0.",
    )
    pp_layer_partition: list[int] | None = Field(
        None, description="Layers per pipeline rank (VLLM_PP_LAYER_PARTITION); None = vLLM's even split."
    )
    # --- issue 48: on-demand engines (planner/on_demand_spec.py); left out of the dump when unset ---
    on_demand: OnDemandSpec | None = Field(
        None, exclude_if=lambda v: v is None, description="Sleep when idle and wake on a request; None = always awake."
    )
    vllm_build: str = Field(
        "0.32.0",
        min_length=1,
        description="The vLLM the engine runs: a release (the pinned "
        "0.32.0, or the version a container ships) or a named build (planner/ple_switch.py). "
        "Decides the switch that puts the PLE on disk; a build without one refuses ple: disk.",
    )

    @model_validator(mode="after")
    def _nodes_agree(self) -> "ChatSpec":
        if self.nodes and self.node and self.node != self.nodes[0]:
            raise ValueError(
                f"node {self.node!r} and nodes {self.nodes} disagree: the replica lives on the "
                "first of nodes; drop node or make it nodes[0]"
            )
        if len(set(self.nodes)) != len(self.nodes):
            raise ValueError(f"nodes {self.nodes} names a pool twice")
        return self


class EmbedderSpec(_Strict):
    """The sentence-transformers embedder."""

    model_id: str = Field(..., description="Name clients send as `model` to /v1/embeddings.")
    model: str = Field(..., description="sentence-transformers folder.")
    hub: HubSource | None = Field(
        None,
        description="Hub repo `poolserve fetch` downloads the folder (`model`) "
        "from; None = the folder is provided locally.",
    )
    batch_size: int = Field(
        32,
        ge=1,
        le=1024,
        description="Texts embedded per forward pass. A question waits for "
        "the batch in progress (rag/retrieval/embed_turns.py), so on CPU keep it small: 4 is as "
        "fast as 32 there (docs/BENCHMARKS.md section 8.3).",
    )
    # 5 s: an interactive user's next question comes within it; beside a bulk ingest another tenant's RAG p95 went
    # from 1.95-2.26x quiet to 1.60-1.85x (docs/SECURITY.md). Measured on CPU only, with batches of 4.
    question_window_s: float = Field(
        5.0,
        ge=0,
        description="While a question came in this recently, document "
        "batches are half of batch_size (at least 1), so a question waits for half a "
        "batch of another tenant's ingest; 0 = always whole batches.",
    )
    num_cpus: float = Field(0.3, gt=0, description="Ray CPUs for the embedder.")
    serve: ServeSpec = _serve(64)
    torch_threads: int = Field(
        1,
        ge=1,
        description="torch intra-op threads (questions, and every batch while the "
        "rest of the machine keeps the other cores busy); the chat engine's OMP threads are "
        "planned around them.",
    )
    ingest_threads: int | None = Field(
        None,
        ge=1,
        description="Most threads for a batch of documents: torch's, "
        "borrowing before each batch the cores the rest of the machine left idle "
        "since the last one (the chat engine between requests), never fewer than "
        "torch_threads; and the tokenizer's, which chunks and tokenizes an ingest's "
        "documents in parallel. None = the pool's CPUs (on a GPU pool half of them); "
        "torch_threads = never borrow. docs/BENCHMARKS.md section 8.1.",
    )
    query_prefix: str = Field(
        "",
        description="Text put in front of every question before it is embedded, for models "
        "trained with a query instruction (bge-*-en-v1.5: 'Represent this sentence for searching "
        "relevant passages: '); documents are embedded as they are. Empty for all-MiniLM-L6-v2.",
    )
    max_seq_tokens: int = Field(
        256, ge=8, description="Longest input the embedder reads (MiniLM: 256), for activations."
    )
    cpu_nice: int = Field(
        10,
        ge=0,
        le=19,
        description="The embedder's CPU priority (Linux nice, every thread): "
        "a bulk ingest's batches yield the cores to the chat engine, the gateway and Ray's "
        "proxy, which otherwise waited up to a second for a core behind them; idle cores "
        "still go to the batches. 0 = as every other replica (docs/SECURITY.md, bulk ingest).",
    )
    node: str | None = Field(None, description="Pool (node) name to place the replica on; None = the first.")


class TenantQuotaSpec(_Strict):
    """What one tenant may store (retriever.tenant_quotas); None = no quota of its own."""

    chunks: int | None = Field(None, ge=1, description="Chunks the tenant may store, over all its collections.")
    documents: int | None = Field(None, ge=1, description="Documents the tenant may store.")


class RetrieverSpec(_Strict):
    """The FAISS index over the chunk store."""

    index: Literal["flat", "hnsw"] = Field(
        "flat", description="FAISS index kind (Flat: exact; HNSW: approximate, for large sets)."
    )
    capacity_chunks: int = Field(200_000, ge=1, description="Chunks the index is planned to hold (all tenants).")
    tenant_max_chunks: int | None = Field(
        None,
        ge=1,
        description="Chunks one tenant may store, refused (413 with "
        "the tenant's own figures) before capacity_chunks is; None = up to "
        "capacity_chunks. tenant_quotas overrides it per tenant.",
    )
    tenant_max_documents: int | None = Field(
        None, ge=1, description="Documents one tenant may store; None = no limit of its own."
    )
    tenant_quotas: dict[str, TenantQuotaSpec] = Field(
        default_factory=dict,
        description="Per-tenant overrides of tenant_max_chunks / tenant_max_documents, by tenant name.",
    )
    hnsw_rebuild_deleted_fraction: float = Field(
        0.2,
        gt=0,
        le=1,
        description="HNSW marks replaced and deleted "
        "vectors deleted instead of rebuilding; past this fraction of a "
        "collection's vectors it is rebuilt from SQLite.",
    )
    index_save_interval_s: float = Field(
        60.0,
        gt=0,
        description="Seconds between saves of changed FAISS indexes "
        "to the state dir (and at shutdown), so a restart loads them.",
    )
    hnsw_m: int = Field(32, ge=4, description="HNSW graph degree.")
    hnsw_ef_search: int = Field(
        256,
        ge=1,
        description="HNSW candidates kept while searching (FAISS efSearch; "
        "a filtered search keeps at least top_k). On MiniLM chunks 256 found 97% of the "
        "exact top 10 at 100k chunks (64: 83%) and 77% at 1M (64: 62%) for 0.4 ms a "
        "question (docs/BENCHMARKS.md section 2).",
    )
    num_cpus: float = Field(0.1, gt=0, description="Ray CPUs for the retriever.")
    serve: ServeSpec = _serve(64)
    faiss_threads: int = Field(1, ge=1, description="FAISS OpenMP threads.")
    dim: int | None = Field(None, ge=1, description="Vector dimension; None = the embedder's hidden_size.")
    sqlite_cache_bytes: Size = Field(
        parse_size("64MiB"), description="SQLite page cache (PRAGMA cache_size) of the chunk store."
    )
    node: str | None = Field(None, description="Pool (node) name to place the replica on; None = the first.")


class ExtractionSpec(_Strict):
    """Extraction of uploads (Markdown, HTML, PDF, DOCX, PPTX) in the gateway's worker processes
    (rag/documents/extract_worker.py): each document in its own capped child, its CPU time charged to the tenant."""

    workers: int = Field(
        1,
        ge=1,
        le=16,
        description="Worker processes (documents extracted at once per gateway "
        "replica); each holds the parsers (~36 MiB anonymous, planned on the gateway's line).",
    )
    cpu_seconds: int = Field(
        30,
        ge=1,
        description="CPU-time cap per document (RLIMIT_CPU of its child); a document "
        "over it is a 422 naming the cap. Markdown/HTML cost about 13 s per million characters "
        "of list-heavy input; a 17-page PDF 0.6 s.",
    )
    memory_bytes: Size = Field(
        parse_size("512MiB"),
        description="Address-space cap per document's child (RLIMIT_AS, "
        "the parsers' ~80 MiB of mappings included); over it is a 413 naming the cap. The "
        "plan counts it as the gateway's growth, once per worker.",
    )
    wall_seconds: float = Field(
        120.0,
        gt=0,
        description="Wall-clock limit per document (a child waiting on nothing "
        "the CPU cap can see); over it is a 422 naming the limit.",
    )
    cpu_nice: int = Field(
        10,
        ge=0,
        le=19,
        description="Each document's child runs at this Linux nice, as the "
        "embedder does (embedder.cpu_nice): a heavy upload yields the cores to other tenants' chat "
        "and questions (docs/SECURITY.md, heavy extraction).",
    )
    max_document_bytes: Size = Field(
        parse_size("32MiB"),
        description="Largest uploaded file (base64 or multipart) before extraction; larger is a 413.",
    )
    max_locations: int = Field(
        2000,
        ge=1,
        description="Pages, slides or sections that get their own citation "
        "location; later ones cite as the last (bounds the map stored with the document).",
    )


class FusionSpec(_Strict):
    """How hybrid retrieval merges the dense and lexical rankings (measured in docs/BENCHMARKS.md section 7)."""

    # Weighted 0.7/0.3 is at or near the best recall on all three corpora measured (pydoc, the SQLite
    # manual, 61 LaTeX PDFs: docs/BENCHMARKS.md 7.1 and 7.3); RRF k=60 led only on pydoc. The no-answer
    # threshold does not move with it: it reads the dense cosine, not the fused score (rag/retrieval/no_answer.py).
    method: Literal["rrf", "weighted"] = Field(
        "weighted", description="Min-max normalised weighted scores, or reciprocal-rank fusion."
    )
    rrf_k: float = Field(60.0, ge=0, description="RRF's rank constant: larger flattens the head of each list.")
    dense_weight: float = Field(
        0.7,
        ge=0,
        description="Weight of the dense ranking (with rrf, of its reciprocal "
        "ranks: set both weights to 1 for plain RRF).",
    )
    lexical_weight: float = Field(0.3, ge=0, description="Weight of the lexical (bm25) ranking.")
    candidates: int = Field(50, ge=1, description="Chunks taken from each index before fusing (at least top_k).")
    # 0.2 with chunks_per_document 1: the most found at rank 1 over the three tuning corpora (pydoc, the SQLite
    # manual, the LaTeX PDFs: 257 of 284, against 254 with 0.1) and none lost at rank 5 (280). Alone, 0.2 had lost
    # one at rank 5 on SQLite, so 0.1 was chosen first (docs/BENCHMARKS.md sections 7.6, 7.8).
    document_support: float = Field(
        0.2,
        ge=0,
        description="Each fused chunk also scores this times the best fused "
        "score of another chunk of its document among the candidates: a page that "
        "answers in several places ranks over one that matches once. 0 = off.",
    )
    # 1: over the three tuning corpora (284 questions, document support 0.1) 5 more found in the top 5 (275 -> 280:
    # pydoc +2, SQLite +2, LaTeX PDFs +1), none lost; 2 found 1 more, 3 one more. Rank 1 cannot move
    # (docs/BENCHMARKS.md section 7.8).
    chunks_per_document: int = Field(
        1,
        ge=0,
        description="In every mode, each document's chunks beyond its best "
        "this many go after the other documents' chunks, so a page that matches in "
        "many places cannot fill the top_k alone; nothing is dropped. 0 = off.",
    )


class RagSpec(_Strict):
    """Chunking and retrieval defaults."""

    extraction: ExtractionSpec = Field(default_factory=ExtractionSpec, description="Upload extraction caps.")
    fusion: FusionSpec = Field(default_factory=FusionSpec, description="Hybrid retrieval's fusion of the rankings.")

    retrieval: Literal["dense", "lexical", "hybrid"] = Field(
        "hybrid",
        description="How RAG finds chunks: dense (embedding similarity, FAISS), lexical (SQLite FTS5 "
        "bm25: exact names, flags, error codes) or hybrid (both, fused by rag.fusion). Hybrid measured best "
        "on every metric (docs/BENCHMARKS.md section 7).",
    )
    embed_title: bool = Field(
        True,
        description="Embed each chunk with its document's title in front (metadata "
        "'title', else a first line of at most 120 characters); stored chunks stay as written.",
    )
    embed_section: bool = Field(
        False,
        description="Also embed each chunk with the heading path of the section it "
        "starts in (HTML and Markdown headings, DOCX sections: rag/documents/extract.py). Off: on the "
        "SQLite manual hybrid recall@1 went 0.800 -> 0.815, but on the two held-out manuals "
        "it lost a question each (Git 0.744 -> 0.732 at rank 1, Apache 0.961 -> 0.947 at "
        "rank 5; docs/BENCHMARKS.md 7.7).",
    )
    embed_batch_chunks: int = Field(
        64,
        ge=1,
        description="Chunks per embedder call during an ingest: the "
        "granularity of its progress reports and of a job's cancel: a call of 256 took "
        "about 18 s beside a chatting tenant on 2 CPU cores, and a cancelled job ran on "
        "that long; 64 is a quarter of it.",
    )
    chunk_tokens: int = Field(200, ge=16, description="Chunk size in embedder tokens (MiniLM reads 256 at most).")
    chunk_overlap: int = Field(30, ge=0, description="Tokens shared by neighbouring chunks.")
    default_top_k: int = Field(4, ge=1, description="Chunks retrieved when the request does not say.")
    max_top_k: int = Field(20, ge=1, description="Largest top_k a request may ask for.")
    context_tokens: int | None = Field(
        None,
        ge=16,
        description="Most chat-model tokens of retrieved passages in a "
        "RAG prompt (best first; a request may ask for fewer); None = all top_k. The "
        "prompt's prefill is most of a CPU answer's time (docs/BENCHMARKS.md 2.5).",
    )
    max_documents_per_request: int = Field(256, ge=1, description="Documents per ingest request.")
    documents_page_default: int = Field(
        20, ge=1, description="Documents a listing page holds when the request gives no `limit`."
    )
    documents_page_max: int = Field(100, ge=1, description="Largest `limit` of a document listing page.")
    max_document_chars: int = Field(2_000_000, ge=1, description="Characters per ingested document.")
    max_ingest_jobs_per_tenant: int = Field(
        2, ge=1, description='Ingest jobs ("async": true) one tenant may run at once; another is a 429 until one ends.'
    )
    ingest_job_heartbeat_s: float = Field(
        5.0,
        gt=0,
        description="How often a running ingest job says it is "
        "alive; one silent for 6 beats (its replica died) reads as failed.",
    )
    ingest_job_retention_s: float = Field(86400.0, gt=0, description="How long a finished ingest job stays readable.")
    max_question_chars: int = Field(
        8000,
        ge=16,
        description="Characters in the question of a search, a RAG "
        "query or chat-with-RAG (its last user message); longer ones get 400.",
    )
    answer_max_tokens: int = Field(
        128,
        ge=1,
        description="Default completion budget of a RAG answer "
        "(/v1/rag/query, and chat with `rag` when the request has no max_tokens). 256 "
        "until 2026-12-06: SmolLM2-135M rarely stops on its own, and 19 of 20 Git "
        "manual questions ran to 256 tokens; 128 halves the decode "
        "(docs/results/rag-answer-length-2026-12-06.md).",
    )
    trim_capped_answers: bool = Field(
        True,
        description="A RAG answer (/v1/rag/query, chat with `rag`) whose "
        "generation hit its token cap ends at its last complete sentence "
        '(rag/retrieval/answer_trim.py); finish_reason stays "length" and usage counts '
        "every generated token. Streams hold back only the partial sentence after "
        "the last sentence end. false: the cut-off text as generated.",
    )
    min_score: float = Field(
        0.30,
        ge=-1.0,
        le=1.0,
        description="No-answer threshold: a RAG query or chat-with-RAG "
        "whose question has a best cosine similarity below this with every chunk the filters "
        "allow gets a fixed 'the knowledge base does not contain an answer' reply, no "
        "generation and no citations. Dense and hybrid retrieval only (lexical has no "
        "similarity; it refuses only when nothing matched). A request's `min_score` overrides "
        "it; -1 turns it off. 0.30 (all-MiniLM-L6-v2) refused none of 160 answerable questions "
        "and 26 of 40 unanswerable ones (docs/BENCHMARKS.md section 7); another embedder "
        "needs its own measurement.",
    )


class GatewaySpec(_Strict):
    """The FastAPI ingress."""

    num_cpus: float = Field(0.2, gt=0, description="Ray CPUs for the gateway (ingress).")
    serve: ServeSpec = _serve(512)
    max_body_bytes: Size = Field(
        parse_size("8MiB"),
        description="Larger request bodies get 413 (a larger Content-Length before any byte of the body is read).",
    )
    login_form_max_bytes: int = Field(
        1024,
        ge=64,
        le=65536,
        description="Largest body of POST /dashboard/login "
        "(a form with the admin key); every other public path (/healthz, /docs, "
        "/openapi.json, the login page, static files) accepts no body at all.",
    )
    client_max_concurrent: int = Field(
        8,
        ge=1,
        description="Unauthenticated requests (public paths, the login "
        "form, wrong keys) one client address may have in flight at once; more "
        "get 429. Per gateway replica; a request with a valid key never counts.",
    )
    client_requests_per_minute: int = Field(
        300,
        ge=1,
        description="Unauthenticated requests one client address "
        "may make in a moving minute; more get 429. Per gateway replica.",
    )
    login_failures_per_minute: int = Field(
        5,
        ge=1,
        description="Wrong admin keys one client address may send "
        "to the dashboard login form in a moving minute; then the form "
        "answers 429 (without checking the key) until the oldest leaves it.",
    )
    refusal_delay_s: float = Field(
        1.0,
        ge=0,
        description="Ray's proxy answers a body sent to a public path "
        "(which no honest client sends) after this long, the connection idle and "
        "the body unread, so a flooding client gets one refusal per connection per "
        "delay (gateway/middleware/proxy_guard.py). 0 = at once.",
    )
    refusal_delay_max: int = Field(
        256,
        ge=0,
        description="Refusals Ray's proxy holds back at once; beyond them "
        "it refuses at once (bounds the idle connections a flood can leave).",
    )
    reads_at_once_alone: int = Field(
        4,
        ge=1,
        description="Reads (listings, collection info, searches) one tenant "
        "may run at once while no other tenant has work in flight; while another "
        "has, its reads take turns, one at a time (gateway/middleware/read_lanes.py: four "
        "readers of one tenant made another tenant's chat p95 3x quiet, one reader "
        "1.6-2.1x). Per gateway replica.",
    )
    reads_pause_ratio: float = Field(
        5.0,
        ge=0,
        description="While another tenant works, a read keeps its "
        "tenant's turn this many times as long as it took (at most 1 s) after its "
        "response: 5 leaves a tenant's back-to-back reads a sixth of one lane. Four "
        "readers against another tenant's chat and RAG p95 (docs/SECURITY.md), x quiet: "
        "no turns 2.6-3.1x and 2.5-3.4x (two runs); turns alone 2.2-2.6x and 2.0-2.2x "
        "(three); ratio 1 2.1-2.2x and 1.8x (three); ratio 2 1.8-2.2x and 1.4-1.6x "
        "(six); ratio 3 1.7-2.1x and 1.4-1.6x (five); ratio 5 1.6-1.9x and 1.3-1.6x "
        "(three).",
    )
    reads_queue_max: int = Field(
        32, ge=1, description="Reads of one tenant waiting for their turn at once; more get 429. Per gateway replica."
    )
    reads_wait_s: float = Field(
        30.0, gt=0, description="Longest a read waits for its tenant's earlier reads; then 429."
    )
    tracked_clients: int = Field(
        4096,
        ge=16,
        description="Client addresses the per-client limits remember at "
        "once; the least recently seen is forgotten first.",
    )
    cookie_secure: bool | Literal["auto"] = Field(
        "auto",
        description="The dashboard session cookie's Secure "
        "flag: true (always: set it behind a TLS proxy), false (never), "
        "or auto (when the request came over https, or when "
        "trust_forwarded_proto is set and X-Forwarded-Proto says https).",
    )
    trust_forwarded_proto: bool = Field(
        False,
        description="Believe the X-Forwarded-Proto header (a TLS proxy in "
        "front of the gateway sets it); off, a client could send it itself.",
    )
    host: str = Field(
        "127.0.0.1",
        description="Address the gateway listens on. Loopback by default; '0.0.0.0' "
        "opens it to the network (the only port poolserve ever opens).",
    )
    port: int = Field(8000, ge=1, le=65535, description="The gateway's port.")
    replicas: int = Field(1, ge=1, le=16, description="Gateway replicas; tenant limits are shared between them.")
    max_choices: int = Field(
        4,
        ge=1,
        le=128,
        description="Largest `n` (and `best_of`) a chat or completion "
        "request may ask for; each choice is a full generation.",
    )
    max_prompts: int = Field(16, ge=1, le=1024, description="Prompts in one /v1/completions request.")
    max_embedding_inputs: int = Field(
        2048,
        ge=1,
        description="Inputs in one /v1/embeddings request (each is read up to the embedder's max_seq_tokens).",
    )
    unavailable_retry_after_s: int = Field(
        10, ge=1, description="Retry-After sent with a 503 while a replica restarts."
    )
    request_timeout_s: float = Field(300.0, gt=0, description="Seconds before a request is abandoned.")
    health_timeout_s: float = Field(
        5.0,
        gt=0,
        description="/healthz waits this long for each replica's answer; a replica silent for longer reads as down.",
    )
    healthy_ttl_s: float = Field(
        2.0,
        ge=0,
        description="A passed /healthz is trusted this long (a failed request "
        "resets it): a replica that died shows within seconds, while a load balancer "
        "polling /healthz costs little.",
    )
    dashboard_refresh_s: float = Field(5.0, gt=0, description="How often the dashboard page reloads itself.")
    dashboard_history_sample_s: float = Field(
        60.0,
        gt=0,
        description="How often the gateway records every replica's memory for the dashboard's last-hour chart.",
    )
    dashboard_measure_timeout_s: float = Field(
        30.0, gt=0, description="The longest the dashboard waits for a replica's memory reading."
    )
    direct_ingress: bool = Field(
        False,
        description="Clients reach the gateway replica's own HTTP server "
        "(Ray Serve direct ingress) instead of going through Ray Serve's proxy actor: "
        "one process hop less per request and per streamed batch. One replica only; "
        "the proxy stays up on a private loopback port. docs/BENCHMARKS.md section 4.",
    )

    @model_validator(mode="after")
    def _direct_ingress_needs_one_replica(self) -> GatewaySpec:
        if self.direct_ingress and self.replicas != 1:
            raise ValueError(
                "gateway.direct_ingress serves one replica on the gateway's port; with "
                f"replicas: {self.replicas} put a load balancer in front instead"
            )
        return self


class RaySpec(_Strict):
    """Ray's own processes and object store, planned out of the pool like any replica."""

    object_store_memory: Size = Field(
        parse_size("256MiB"),
        description="Plasma store size (shared memory); Ray's default of 30% of RAM is never used.",
    )
    include_dashboard: bool = Field(False, description="The dashboard costs ~0.8 GB; off unless asked for.")
    allow_open: bool = Field(
        False,
        description="Deploy on a Ray cluster that listens beyond loopback or has no "
        "private token (token auth off, or a token file others can read): anyone who reaches "
        "such a Ray runs code as this user. Off: the app refuses to deploy there, as on plain "
        "`serve run serve.yaml` with Ray's defaults; `poolserve up` starts a closed Ray. Only "
        "for a cluster an operator closed by other means (a firewall, a private network).",
    )


class StressSpec(_Strict):
    """`poolserve stress`: how hard each layer pushes and what counts as a pass (docs/STRESS.md).
    The defaults are for the CPU default (configs/cpu-tiny.yaml); the Spark profiles set their own."""

    memory_drift_fraction: float = Field(
        0.02,
        gt=0,
        lt=1,
        description="A replica's memory (PSS from /status) may "
        "grow over a layer after warm-up by what its plan lets it grow (budget - "
        "at-rest); where the plan gives no growth, by this fraction...",
    )
    memory_drift_bytes: Size = Field(parse_size("50MiB"), description="...or this many bytes, whichever is larger.")
    sequential_requests: int = Field(
        100, ge=1, description="Layer 1: sequential requests of each kind (chat, RAG query, embeddings)."
    )
    quick_sequential_requests: int = Field(5, ge=1, description="Layer 1 in --quick mode.")
    long_context_fractions: list[float] = Field(
        [0.5, 0.9, 1.0], min_length=1, description="Layer 2: prompt + max_tokens as fractions of max_model_len."
    )
    quick_long_context_fractions: list[float] = Field(
        [1.0],
        min_length=1,
        description="Layer 2 in --quick "
        "mode: the whole context, the boundary the one-over check "
        "tests (streamed with no cached prefix; the plain request reuses the prefix the prompt sizer's "
        "last probe prefilled).",
    )
    concurrency_clients: int = Field(32, ge=1, description="Layer 3: concurrent clients.")
    concurrency_seconds: float = Field(600.0, gt=0, description="Layer 3: how long the clients run.")
    quick_concurrency_seconds: float = Field(60.0, gt=0, description="Layer 3 in --quick mode.")
    concurrency_tenants: int = Field(3, ge=1, description="Layer 3: tenants the clients are spread over.")
    warmup_seconds: float = Field(30.0, ge=0, description="Layers 1 and 3: load before the memory baseline is read.")
    client_timeout_s: float = Field(300.0, gt=0, description="A request taking longer is a client timeout (a fail).")
    mixed_concurrency: int = Field(8, ge=1, description="Layer 4: fixed concurrency of the mixed-length load.")
    quick_mixed_concurrency: int = Field(4, ge=1, description="Layer 4's concurrency in --quick mode.")
    mixed_requests: int = Field(100, ge=1, description="Layer 4: requests (30% short, 50% medium, 20% long).")
    quick_mixed_requests: int = Field(
        10, ge=1, description="Layer 4 in --quick mode: one whole mix (3 short, 5 medium, 2 long)."
    )
    short_prompt_tokens: int = Field(200, ge=1, lt=512, description="Layer 4: a short prompt's tokens.")
    medium_prompt_tokens: int = Field(1000, ge=512, description="Layer 4: a medium prompt's tokens.")
    long_prompt_tokens: int = Field(
        3000, ge=1, description="Layer 4: a long prompt's tokens (kept inside max_model_len)."
    )
    short_p95_s: float = Field(
        60.0,
        gt=0,
        description="Layer 4: p95 latency bound of short prompts (< 512 tokens): "
        "they must not starve behind long ones. CPU default: 8 mixed requests queue ~9k "
        "prefill tokens, ~15 s at this engine's ~600-800 prefill tokens/s on 2 quiet cores; "
        "60 s is four such rounds.",
    )
    quick_kill_targets: list[Literal["engine", "embedder", "retriever", "gateway"]] = Field(
        ["gateway"],
        description="Layer 5 in --quick mode: the replicas killed (the full run kills all four, then "
        "restarts the whole stack). The gateway: its loss cuts every route; the test suite kills the embedder, "
        "the retriever (during ingest) and the engine with checks of their own (tests/integration/test_faults.py).",
    )
    recovery_timeout_s: float = Field(300.0, gt=0, description="Layer 5: longest wait for healthy after a kill.")
    max_recovery_s: float = Field(180.0, gt=0, description="Layer 5: a replica back later than this fails.")
    max_restart_s: float = Field(
        300.0, gt=0, description="Layers 5 and 7: the whole stack healthy later than this after its start fails."
    )
    clock_drop_fraction: float = Field(
        0.15, gt=0, lt=1, description="Layer 6: a clock this far below its first samples' median..."
    )
    clock_drop_seconds: float = Field(30.0, gt=0, description="...for this long (sustained) fails.")
    max_temperature_c: float | None = Field(
        None, description="Layer 6: fail above this temperature; None = only the clock and the throttle reasons count."
    )


class Profile(_Strict):
    """What to host on which pool, and how hard it will be used."""

    name: str = Field(..., description="Profile name, shown in plans.")
    state_dir: str = Field("var", description="SQLite databases, FAISS snapshots and the demo key live here.")
    pools: list[PoolSpec] = Field(
        default_factory=lambda: [PoolSpec()], min_length=1, description="One entry per node; one node runs here."
    )
    chat: ChatSpec = Field(..., description="The vLLM chat engine (the default model; started first).")
    engines: list[ChatSpec] = Field(
        default_factory=list,
        description="More vLLM chat engines in the same pool, "
        "each planned with its own admission step and started after the one before.",
    )
    embedder: EmbedderSpec = Field(..., description="The embedder.")
    retriever: RetrieverSpec = Field(default_factory=RetrieverSpec, description="The FAISS retriever.")
    rag: RagSpec = Field(default_factory=RagSpec, description="RAG defaults.")
    gateway: GatewaySpec = Field(default_factory=GatewaySpec, description="The ingress.")
    ray: RaySpec = Field(default_factory=RaySpec, description="Ray's object store and dashboard.")
    tenants_file: str | None = Field(None, description="YAML of tenants to create at start.")
    stress: StressSpec = Field(default_factory=StressSpec, description="`poolserve stress` thresholds and sizes.")

    @model_validator(mode="after")
    def _distinct_model_ids(self) -> "Profile":
        ids = [self.chat.model_id, *(e.model_id for e in self.engines), self.embedder.model_id]
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise ValueError(
                f"model_id {', '.join(repeated)} is used twice; every engine and the embedder need their own name"
            )
        return self

    @model_validator(mode="after")
    def _nodes_do_not_share_ports(self) -> "Profile":
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"pools {names} name a node twice")
        for i, pool in enumerate(self.pools):
            if len(self.pools) > 1 and pool.address in ("127.0.0.1", "localhost", "::1"):
                raise ValueError(
                    f"node {pool.name}: address {pool.address} is where Ray, once nodes may join, puts "
                    "this machine's own address instead (ray/_private/services.py "
                    "resolve_ip_for_localhost); give the node's link address, or another loopback "
                    "address such as 127.0.0.3 for nodes on one machine"
                )
            for other in self.pools[i + 1 :]:
                if pool.address != other.address:
                    continue
                shared = pool.ray_ports.listening(i == 0) & other.ray_ports.listening(False)
                if shared:
                    raise ValueError(
                        f"nodes {pool.name} and {other.name} share address {pool.address} and Ray ports "
                        f"{sorted(shared)[:5]}: give one of them other ray_ports (or another address)"
                    )
        return self

    def chat_engines(self) -> list[tuple[str, ChatSpec]]:
        """(replica name, spec) of every chat engine, in start order; the first is `chat`."""
        return [("chat", self.chat), *((f"chat-{e.model_id}", e) for e in self.engines)]

    def resolve_paths(self, root: Path) -> "Profile":
        """Return a copy whose local paths are absolute (a models/ name stays a name if absent)."""
        data = self.model_dump(exclude_unset=True)  # unset fields stay unset: pins stay recognisable
        data["state_dir"], data["tenants_file"] = self.state_dir, self.tenants_file
        return Profile.model_validate(absolute_paths(data, root))


def absolute_paths(data: dict, root: Path) -> dict:
    """A profile's mapping (or part of one: a file that extends another) with its local paths made absolute
    against root; a models/ name that is not there stays a name (a hub name)."""

    def absolute(p: str | None) -> str | None:
        if p is None:
            return None
        path = Path(p)
        return str(path if path.is_absolute() else (root / path).resolve())

    data = {**data}
    for key in ("state_dir", "tenants_file"):
        if key in data:
            data[key] = absolute(data[key])
    if isinstance(data.get("embedder"), dict) and data["embedder"].get("model"):
        data["embedder"] = {**data["embedder"], "model": absolute(data["embedder"]["model"])}
    engines = [engine for engine in (data.get("chat"), *(data.get("engines") or [])) if isinstance(engine, dict)]
    for engine in engines:
        for section in (engine, engine.get("speculative") or {}):
            model = section.get("model")
            # a folder fetched from a hub is always a path, even before it exists
            if isinstance(model, str) and (("/" in model) or (root / model).exists() or section.get("hub")):
                section["model"] = absolute(model)
    return data


def project_root_for(profile_path: Path) -> Path:
    """Profiles in configs/ resolve paths against the project root; others against their folder."""
    folder = profile_path.resolve().parent
    return folder.parent if folder.name == "configs" else folder


def pinned(spec: BaseModel, field: str) -> bool:
    """True when the profile set this field explicitly (the planner keeps it or refuses)."""
    return field in spec.model_fields_set


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    # each file's paths against its own root, so a profile elsewhere can extend one in configs/
    data = read_profile_data(path, lambda part, source: absolute_paths(part, project_root_for(source)))
    return Profile.model_validate(data).resolve_paths(project_root_for(path))
