"""Typed outputs of a plan: the vLLM engine arguments, Ray actor options and gateway settings that
the runtime uses. Every field is planned; nothing downstream computes a number of its own."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.guard import GuardPlan
from planner.profile import FusionSpec, GatewaySpec, RagSpec, TenantQuotaSpec


class _Output(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    def as_dict(self) -> dict:
        """What the runtime receives: unset (None) options are left to the library's default."""
        return self.model_dump(exclude_none=True)


class EngineArgs(_Output):
    """One chat engine's vLLM arguments (AsyncEngineArgs names), passed as ray.serve.llm engine_kwargs as they are
    (complete when the planner returns them: planner/engine_args.py)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=(), frozen=True)

    dtype: str = Field(description="Weights and activations dtype.")
    max_model_len: int = Field(description="Longest prompt + completion, in tokens.")
    max_num_seqs: int = Field(
        description="Sequences decoded together: bounds the KV pool's concurrent use and the activations planned."
    )
    max_num_batched_tokens: int = Field(description="Tokens one scheduler step may run (prefill chunk size).")
    kv_cache_memory_bytes: int = Field(description="KV cache bytes vLLM allocates: exactly the plan's KV pool.")
    gpu_memory_utilization: float | None = Field(
        None, description="GPU only: fraction of the pool the engine may hold; covers exactly its planned bytes."
    )
    enable_prefix_caching: bool = Field(description="Reuse KV blocks of shared prompt prefixes.")
    enable_chunked_prefill: bool = Field(True, description="Split long prompts across scheduler steps.")
    block_size: int | None = Field(None, description="KV cache block in tokens; None: vLLM's platform default.")
    kv_cache_dtype: str | None = Field(None, description="KV cache dtype when not the model dtype (fp8).")
    speculative_config: dict | None = Field(None, description="vLLM speculative_config (ngram, draft, MTP).")
    quantization: str | None = Field(None, description="vLLM quantization method of the checkpoint.")
    mamba_cache_mode: str | None = Field(None, description="Hybrid models: how recurrent state is cached.")
    mamba_ssm_cache_dtype: str | None = Field(None, description="Hybrid models: dtype of the SSM state.")
    enforce_eager: bool | None = Field(None, description="No torch.compile / CUDA graphs.")
    compilation_config: dict | None = Field(None, description="GPU: CUDA graph capture sizes.")
    load_format: str | None = Field(None, description="'dummy': random weights (plan validation, benchmarks).")
    additional_config: dict | None = Field(None, description="Platform options (gdn_prefill_backend).")
    limit_mm_per_prompt: dict | None = Field(None, description="Multimodal inputs per prompt (0: text only).")
    pipeline_parallel_size: int | None = Field(
        None, exclude_if=lambda v: v is None, description="Pipeline ranks (layers split), when > 1."
    )
    tensor_parallel_size: int | None = Field(
        None, exclude_if=lambda v: v is None, description="Tensor ranks (heads split), when > 1."
    )
    worker_cls: str | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="CPU: the worker that runs a prefill on all the engine's threads and "
        "a decode step on fewer (vllm_bridge/cpu_worker.py); None: vLLM's.",
    )
    worker_extension_cls: str | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="Methods mixed into vLLM's Worker: the heap trim the chat "
        "replica calls (vllm_bridge/worker_extension.py); None: none.",
    )
    distributed_executor_backend: str | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="Ranks over nodes: 'ray' on GPU pools, 'mp' (vLLM's multi-node multiprocessing) on CPU pools.",
    )
    nnodes: int | None = Field(
        None, exclude_if=lambda v: v is None, description="CPU ranks over nodes ('mp'): the nodes the engine spans."
    )
    node_rank: int | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="CPU ranks over nodes: this process's node (0: the replica's).",
    )
    master_addr: str | None = Field(
        None, exclude_if=lambda v: v is None, description="CPU ranks over nodes: node 0's address (torch.distributed)."
    )
    master_port: int | None = Field(
        None, exclude_if=lambda v: v is None, description="CPU ranks over nodes: node 0's rendezvous port."
    )
    enable_sleep_mode: bool | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="GPU on-demand engines: vLLM allocates weights and KV cache "
        "through its CuMemAllocator so that sleep(level) frees them (without it a sleep frees nothing); None "
        "elsewhere (a CPU has no sleep mode: its on-demand engines stop).",
    )


class RayActorOptions(_Output):
    """Ray resources of one replica actor: what the scheduler reserves for it."""

    num_cpus: float = Field(
        description="Ray CPUs (fractions: Ray sees the machine's cores and every replica must fit beside the others)."
    )
    memory: int = Field(description="Ray's logical memory resource: the replica's planned bytes.")
    num_gpus: float | None = Field(None, description="GPU share on a GPU pool; None on CPU.")
    # Left out of the plan when None, so a one-node plan reads as it did before nodes were planned.
    resources: dict[str, float] | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="Custom "
        "resources: the node's placement resource (planner/nodes.py) "
        "on a plan of several nodes; None on one node.",
    )


class ChatModelCard(_Output):
    path: str = Field(description="Model folder: the gateway loads its tokenizer to count prompt tokens.")
    max_model_len: int = Field(description="The engine's context: longer prompts get a 400 before the engine.")
    replica: str = Field(description="The engine's replica name in the plan.")
    on_demand: bool = Field(
        description="Sleeps when idle and wakes on a request (chat.on_demand): its requests pass the wake coordinator."
    )


class ContentsPlan(_Output):
    """The retriever's growth lines for what it holds now: each stored chunk's index bytes, and SQLite's
    page cache, which fills up to its size with the database as it is read. Measured: flat 1,624 and
    HNSW (M=32) 1,802 bytes per 384-d chunk against 1,592 and 1,848 planned; the 64 MiB cache held
    0.77-0.94 of a database under it, and its whole size above it (bench/bench_retriever_memory.py,
    docs/BENCHMARKS.md "The retriever's memory and its contents")."""

    per_chunk_bytes: int = Field(description="Index bytes one stored chunk adds (vector, graph links, id map).")
    cache_bytes: int = Field(description="SQLite's page cache at most (retriever.sqlite_cache_bytes).")
    capacity_chunks: int = Field(description="Chunks the index is planned for (retriever.capacity_chunks).")

    def bytes_for(self, chunks: int, database_bytes: int) -> int:
        """The growth lines' bytes for `chunks` stored in a database of `database_bytes`."""
        return min(chunks, self.capacity_chunks) * self.per_chunk_bytes + min(self.cache_bytes, database_bytes)


# The GatewaySpec fields GatewaySettings copies as they are.
FROM_GATEWAY_SPEC = (
    "max_choices",
    "max_prompts",
    "max_embedding_inputs",
    "unavailable_retry_after_s",
    "cookie_secure",
    "trust_forwarded_proto",
    "health_timeout_s",
    "healthy_ttl_s",
    "dashboard_refresh_s",
    "dashboard_history_sample_s",
    "dashboard_measure_timeout_s",
)


class GatewaySettings(RagSpec):
    """Everything the gateway reads, from the profile and its plan (the RAG section's fields included)."""

    chat_model_id: str = Field(description="Default chat model.")
    chat_models: dict[str, ChatModelCard] = Field(description="Every chat engine, by the id clients send.")
    embed_model_id: str = Field(description="The embedder's id for /v1/embeddings.")
    planned_bytes: dict[str, int] = Field(description="Each replica's budget (ceiling), for /status and the guard.")
    planned_at_rest_bytes: dict[str, int] = Field(description="Each replica's planned resident memory at rest.")
    planned_contents: dict[str, ContentsPlan] = Field(
        default_factory=dict,
        description="Replicas whose plan "
        "grows with what they hold (the retriever): /status adds "
        "it to the at-rest plan for the current contents.",
    )
    max_choices: int = Field(description="Largest n / best_of.")
    max_prompts: int = Field(description="Most prompts in one completions request.")
    max_embedding_inputs: int = Field(description="Most inputs in one embeddings request.")
    unavailable_retry_after_s: int = Field(description="Retry-After of a 503 while a replica is down.")
    health_timeout_s: float = Field(description="/healthz's wait for each replica (GatewaySpec).")
    healthy_ttl_s: float = Field(description="How long a passed /healthz is trusted (GatewaySpec).")
    dashboard_refresh_s: float = Field(description="The dashboard page's reload period (GatewaySpec).")
    dashboard_history_sample_s: float = Field(description="Period of the dashboard's memory history (GatewaySpec).")
    dashboard_measure_timeout_s: float = Field(description="Longest wait for a replica's memory (GatewaySpec).")
    cookie_secure: bool | Literal["auto"] = Field(description="The dashboard cookie's Secure flag (GatewaySpec).")
    trust_forwarded_proto: bool = Field(description="Whether X-Forwarded-Proto decides an auto Secure flag.")
    embed_max_seq_tokens: int = Field(
        description="Most tokens the embedder reads of one input: caps the TPM "
        "estimate of an embeddings request (characters / 4 per input)."
    )
    state_dir: str = Field(description="SQLite databases, index snapshots, the tenant store.")

    def as_dict(self) -> dict:
        return self.model_dump()


class RetrieverSettings(_Output):
    """Everything the retriever replica reads, from the profile and its plan: bound as it is (deployments/app.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    state_dir: str = Field(description="Where the chunk store (SQLite) and the FAISS snapshots live.")
    dim: int = Field(description="Vector dimension: retriever.dim, else the embedder's hidden size.")
    index_kind: Literal["flat", "hnsw"] = Field(description="FAISS index kind (RetrieverSpec.index).")
    hnsw_m: int = Field(description="HNSW graph degree.")
    hnsw_ef_search: int = Field(description="HNSW candidates kept while searching.")
    faiss_threads: int = Field(description="FAISS OpenMP threads.")
    capacity_chunks: int = Field(description="Chunks the index is planned to hold (all tenants).")
    sqlite_cache_bytes: int = Field(description="SQLite page cache of the chunk store.")
    tenant_max_chunks: int | None = Field(description="Chunks one tenant may store; None = no quota.")
    tenant_max_documents: int | None = Field(description="Documents one tenant may store; None = no quota.")
    tenant_quotas: dict[str, TenantQuotaSpec] = Field(description="Per-tenant overrides of the two above.")
    hnsw_rebuild_deleted_fraction: float = Field(description="Share of marked-deleted HNSW rows that rebuilds.")
    index_save_interval_s: float = Field(description="Seconds between saves of changed FAISS indexes.")
    embedder_model_id: str = Field(description="The embedder whose vectors the store holds (recorded, checked).")
    fusion: FusionSpec = Field(description="Hybrid retrieval's fusion of the rankings (rag.fusion).")


class GatewayEdge(_Output):
    """What the gateway's outer middleware reads (gateway/http_app.py make_app): where the tenants live, the
    pool guard's marks, and the profile's gateway section (keyless clients' limits, the body cap, read lanes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    state_dir: str = Field(description="The tenant store, the limiter's and the rejections' databases.")
    tenants_file: str | None = Field(description="Tenants declared in a file, synced at start; None = none.")
    guard: GuardPlan = Field(description="The pool guard's marks, from what the plan holds (planner/guard.py).")
    gateway: GatewaySpec = Field(description="The profile's gateway section, as the middleware reads it.")


class EmbedderSettings(_Output):
    """Everything the embedder replica reads, from the profile and its plan: bound as it is (deployments/app.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_path: str = Field(description="The sentence-transformers model folder.")
    model_id: str = Field(description="The id clients send to /v1/embeddings.")
    batch_size: int = Field(description="Texts one forward pass embeds.")
    chunk_tokens: int = Field(description="Tokens per chunk (rag.chunk_tokens), cut with the model's tokenizer.")
    chunk_overlap: int = Field(description="Tokens a chunk repeats of the one before (rag.chunk_overlap).")
    torch_threads: int = Field(description="torch threads of a question's forward pass.")
    ingest_threads: int = Field(description="The most threads a document batch may borrow from idle cores.")
    device: Literal["cpu", "cuda"] = Field(description="`cuda` when the plan gives the replica a GPU share.")
    query_prefix: str = Field(description="Prepended to a question before it is embedded (the model's convention).")
    cpu_nice: int = Field(description="Linux nice of the replica's threads (document batches yield to chat).")
    question_window_s: float = Field(description="How recent a question halves the document batch.")


class EngineRank(_Output):
    """A CPU engine split over nodes: its share on one other node, as the chat replica starts it
    (vllm_bridge/engine_ranks.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node_rank: int = Field(description="vLLM's node rank of the share.")
    bundle_index: int = Field(description="Its bundle in the replica's placement group (share i: bundle i + 1).")
    num_cpus: float = Field(description="Ray CPUs of the share's host actor.")
    resources: dict[str, float] = Field(description="Its bundle's other resources (the node's placement resource).")
    env: dict[str, str] = Field(description="The share's engine environment, from its plan.")


class ChatReplicaSettings(_Output):
    """What the chat replica reads beyond ray.serve.llm's own config (deployments/chat.py PoolserveLLMServer)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    warmup_prompt: str = Field(description="Sent once before the replica reports ready.")
    start_after: list[tuple[str, str]] = Field(
        description="(deployment, method) whose health the engine waits for before it starts: the ordered start."
    )
    start_wait_timeout_s: float = Field(description="The longest wait for those.")
    heap_trim_interval_s: float = Field(description="How often the Workers' freed heap is handed back; 0 = never.")
    ranks: list[EngineRank] = Field(default_factory=list, description="A split engine's shares on other nodes.")
    rank_engine_kwargs: dict = Field(
        default_factory=dict,
        description="The ranks' vLLM engine arguments, as vLLM takes them (keywords of its engine args).",
    )
    # issue 48: set only for an on-demand engine (Plan.on_demand); left out of the dump when unset
    sleep: Literal["level_1", "level_2", "stop"] | None = Field(
        None,
        exclude_if=lambda v: v is None,
        description="How the engine sleeps (OnDemandEngine.sleep); None = always awake, sleep_engine() refuses.",
    )
    start_asleep: bool = Field(
        False,
        exclude_if=lambda v: not v,
        description="An on-demand engine beyond the "
        "plan's awake set: the replica starts without its engine, which the first request "
        "wakes, so the pool at rest holds what the plan says.",
    )
