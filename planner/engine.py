"""The chat engine's budget: weights, KV pool, recurrent state, drafter, activations, runtime; and the decisions
its vLLM arguments are made of (planner/engine_args.py turns them into arguments and environment, in one place).

Values pinned in the profile are kept or refused with the reason (PlanError); derived values are
reported in the plan's notes.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner import runtime
from planner.architecture import DTYPE_BYTES, Architecture, read_architecture
from planner.engine_threads import EngineThreads, engine_threads
from planner.errors import EngineError
from planner.kvgroups import KVGroups, kv_cache_groups
from planner.ple_switch import PleSwitchError, ple_disk_switch
from planner.profile import ChatSpec, PoolSpec, pinned
from planner.speculative import Drafter, SpeculativeError, plan_drafter
from planner.units import cdiv, gib
from planner.weights import DEFAULT_QUANTIZED, QUANT_METHODS, component_bytes, component_dtypes, safetensors_bytes


@dataclass(frozen=True)
class EnginePlan:
    """One chat engine planned as one process on its home pool. What comes after (the split over ranks, the
    vLLM arguments, the replicas) reads it and never edits it."""

    chat: ChatSpec  # the chat section with `dtype: auto` resolved
    gpu: bool  # planned for a GPU pool
    arch: Architecture
    quantization: str  # the planner's name: nvfp4, fp8, int4, none, ...
    drafter: Drafter
    max_num_seqs: int
    kv_cache_memory_bytes: int  # the KV pool plus the recurrent state: vLLM's kv_cache_memory_bytes
    mamba_cache_mode: str  # hybrids: `auto` resolved
    ssm_cache_dtype: str  # hybrids: the recurrent state's dtype
    threads: EngineThreads
    ple_switch_env: dict[str, str]  # what keeps a disk-placed PLE out of the pool (ple_switch.py); empty if none
    breakdown: dict[str, int]
    facts: dict
    component_bytes: dict[str, int]
    disk_components: dict[str, int]
    page_cache_bytes: int
    notes: tuple[str, ...]


def _quantization(chat: ChatSpec, arch: Architecture, notes: list[str]) -> str:
    if chat.quantization != "auto":
        return chat.quantization
    q = {"modelopt_fp4": "nvfp4", "modelopt": "fp8", "compressed-tensors": "int4", "gptq": "int4"}.get(
        arch.quantization, arch.quantization
    )
    if q not in QUANT_METHODS:
        notes.append(f"chat: unknown quant_method {arch.quantization!r}; planning weights unquantized")
        return "none"
    return q


def _activations(chat: ChatSpec, a: Architecture, seqs: int, k: int) -> int:
    """Peak live activations of one step: per batched token, the widest layer's tensors in the model
    dtype; plus fp32 logits and probabilities for every sampled position."""
    q = a.num_attention_heads * a.head_dim * (2 if a.attn_output_gate else 1)
    kv = 2 * a.num_kv_heads * a.head_dim
    mlp = max(
        a.intermediate_size if a.moe_layers < a.num_layers else 0,
        a.experts_per_token * a.moe_intermediate_size + a.shared_expert_intermediate_size,
    )
    lin = 3 * a.lin_v_heads * a.lin_v_dim if a.linear_layers else 0
    per_token = DTYPE_BYTES.get(chat.dtype, 2) * (4 * a.hidden_size + q + kv + 3 * mlp + lin)
    logits = seqs * (1 + k) * a.vocab_size * 4 * 2
    return chat.max_num_batched_tokens * per_token + logits


def _kv_dtype(chat: ChatSpec) -> tuple[int, str]:
    if chat.kv_cache_dtype == "auto":
        return DTYPE_BYTES["bfloat16" if chat.dtype == "auto" else chat.dtype], "auto"
    return DTYPE_BYTES[chat.kv_cache_dtype], chat.kv_cache_dtype


def _kv_groups(arch: Architecture, drafter: Drafter, kvb: int) -> KVGroups:
    """vLLM's layer groups for a hybrid; none for single-spec models (one group, no padding).
    Drafter layers shaped like the target's attention share its spec, hence its bucket."""
    if not arch.is_hybrid:
        return KVGroups(0, ())
    buckets = {"attention": arch.full_layers, "sliding": arch.sliding_layers, "state": arch.linear_layers}
    draft = drafter.architecture
    if drafter.method == "mtp":
        buckets["attention"] += arch.mtp_layers
    elif draft is not None:
        same = (draft.num_kv_heads, draft.head_dim, draft.uses_mla) == (arch.num_kv_heads, arch.head_dim, arch.uses_mla)
        buckets["attention" if same else "drafter"] = buckets["attention"] * same + draft.num_layers
    return kv_cache_groups(buckets)


def resolved_dtype(chat: ChatSpec, gpu: bool, cpu_native_bf16: bool) -> str:
    """`dtype: auto`: bfloat16 on a GPU and on a CPU that computes it natively; float32 on a CPU that
    emulates it (an AVX2 host: 4.7x faster prefill and 2.3x faster 8-stream decode in float32,
    docs/BENCHMARKS.md section 1.2)."""
    if chat.dtype != "auto":
        return chat.dtype
    return "bfloat16" if gpu or cpu_native_bf16 else "float32"


@dataclass(frozen=True)
class KVLayout:
    """How one KV block is laid out: its tokens, the bytes each token takes, vLLM's layer groups."""

    block: int  # tokens per block
    kv_dtype_bytes: int
    conv_dtype_bytes: int
    ssm_dtype: str
    target_per_token: int
    indexer_per_token: int
    padding_per_token: int  # empty layer slots of short groups, which still take their page
    groups: KVGroups

    def per_token(self, drafter: Drafter) -> int:
        return self.target_per_token + self.indexer_per_token + drafter.kv_bytes_per_token + self.padding_per_token


@dataclass(frozen=True)
class KVPool:
    """The attention KV pool: whole blocks, and the tokens vLLM will report for them."""

    num_blocks: int
    pool_bytes: int  # may exceed num_blocks x block bytes when pinned (the unused tail)
    tokens: int  # num_blocks x block
    logged_tokens: int  # what vLLM logs: num_blocks / blocks per max_model_len request x max_model_len


def plan_engine(
    chat: ChatSpec, pool: PoolSpec, cpus: float, total: int, other_threads: int, cpu_native_bf16: bool = True
) -> EnginePlan:
    """The engine's budget on `pool` (`cpus` CPUs beside the embedder's `other_threads`), line by line."""
    notes: list[str] = []
    gpu = pool.gpu
    chat = _with_resolved_dtype(chat, gpu, cpu_native_bf16, notes)
    arch = read_architecture(chat.model, chat.architecture)
    quant = _quantization(chat, arch, notes)
    dtypes, comp = _components(chat, arch, quant)
    disk = _disk_components(chat, arch, comp)
    kvb, kv_name = _kv_dtype(chat)
    drafter = _drafter(chat, arch, kvb, kv_name, comp)
    breakdown = _weight_lines(chat, arch, quant, dtypes, comp, disk, gpu, notes)
    layout = _kv_layout(chat, arch, drafter, kvb, gpu, notes)
    per_token = layout.per_token(drafter)
    kv = _kv_pool(chat, layout.block, layout.block * per_token)
    seqs = _max_num_seqs(chat, kv, layout.block, layout.block * per_token, notes)
    if chat.expected_concurrency and chat.expected_concurrency > seqs:
        raise EngineError(f"chat.expected_concurrency {chat.expected_concurrency} exceeds max_num_seqs {seqs}")
    breakdown.update(_kv_pool_lines(layout, kv, drafter))
    mamba_mode = _mamba_cache_mode(chat)
    state_lines = _state_lines(chat, arch, layout, drafter, seqs, mamba_mode)
    breakdown.update(state_lines)
    kv_cache_memory_bytes = kv.pool_bytes + sum(state_lines.values())
    breakdown.update(_compute_and_runtime_lines(chat, arch, drafter, seqs, gpu))
    notes += _settings_not_passed(chat, gpu)
    ple_env = _ple_switch_env(chat, disk, notes)
    threads = engine_threads(chat, gpu, cpus, other_threads)
    facts = _facts(chat, arch, layout, kv, drafter, seqs, kv_cache_memory_bytes, mamba_mode, breakdown, threads, quant)
    return EnginePlan(
        chat=chat,
        gpu=gpu,
        arch=arch,
        quantization=quant,
        drafter=drafter,
        max_num_seqs=seqs,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        mamba_cache_mode=mamba_mode,
        ssm_cache_dtype=layout.ssm_dtype,
        threads=threads,
        ple_switch_env=ple_env,
        breakdown=breakdown,
        facts=facts,
        component_bytes=comp,
        disk_components=disk,
        page_cache_bytes=chat.disk_page_cache_bytes * len(disk),
        notes=tuple(notes),
    )


def _facts(
    chat: ChatSpec,
    arch: Architecture,
    layout: KVLayout,
    kv: KVPool,
    drafter: Drafter,
    seqs: int,
    kv_cache_memory_bytes: int,
    mamba_mode: str,
    breakdown: dict[str, int],
    threads: EngineThreads,
    quant: str,
) -> dict:
    """The engine's figures the plan reports (ChatFacts), vLLM's logged KV tokens among them."""
    state_seq = arch.state_bytes_per_sequence(layout.conv_dtype_bytes, DTYPE_BYTES[layout.ssm_dtype], drafter.k)
    page_per_token_per_layer = arch.kv_bytes_per_token_per_layer(layout.kv_dtype_bytes)
    per_token = layout.per_token(drafter)
    return {
        "vllm_kv_tokens": vllm_logged_kv_tokens(
            kv_cache_memory_bytes,
            chat.max_model_len,
            layout.block,
            layout.groups,
            page_per_token_per_layer,
            per_token,
            1 + drafter.state_blocks + (mamba_mode == "align"),
        ),
        "kv_bytes_per_token": per_token,
        "target_kv_bytes_per_token": layout.target_per_token,
        "indexer_bytes_per_token": layout.indexer_per_token,
        "drafter_kv_bytes_per_token": drafter.kv_bytes_per_token,
        "state_bytes_per_sequence": state_seq,
        "kv_pool_tokens": kv.logged_tokens,
        "block_size": layout.block,
        "num_blocks": kv.num_blocks,
        "max_num_seqs": seqs,
        "kv_cache_memory_bytes": kv_cache_memory_bytes,
        "weight_bytes": sum(v for k, v in breakdown.items() if k.startswith("weights.")),
        "drafter_weight_bytes": drafter.weight_bytes,
        "omp_threads": threads.wide,
        "decode_omp_threads": threads.narrow,
        "omp_bind": threads.bind,
        "quantization": quant,
        "speculative_method": drafter.method,
        "kv_group_size": layout.groups.group_size,
        "kv_group_layers": [f"{g.kind}:{g.layers}" for g in layout.groups.groups],
        "state_pool_bytes_per_sequence": layout.groups.slots("state") * layout.block * page_per_token_per_layer
        if state_seq
        else 0,
    }


def _with_resolved_dtype(chat: ChatSpec, gpu: bool, cpu_native_bf16: bool, notes: list[str]) -> ChatSpec:
    """The chat section with `dtype: auto` replaced by what this pool computes in."""
    if chat.dtype != "auto":
        return chat
    chat = chat.model_copy(update={"dtype": resolved_dtype(chat, gpu, cpu_native_bf16)})
    if not gpu:
        notes.append(
            f"dtype auto -> {chat.dtype}: this CPU "
            f"{'computes bfloat16 natively' if cpu_native_bf16 else 'emulates bfloat16'}"
        )
    return chat


def _components(chat: ChatSpec, arch: Architecture, quant: str) -> tuple[dict[str, str], dict[str, int]]:
    """Each weight component's dtype and bytes (attention, mlp, embeddings, PLE, MTP, vision, ...)."""
    recipe = tuple(arch.published.get("quantized_components", DEFAULT_QUANTIZED))
    try:
        dtypes = component_dtypes(arch, quant, chat.dtype, chat.component_dtypes, recipe)
    except ValueError as exc:
        raise EngineError(str(exc)) from exc
    return dtypes, component_bytes(arch, dtypes)


def _disk_components(chat: ChatSpec, arch: Architecture, comp: dict[str, int]) -> dict[str, int]:
    """The components `chat.placement` keeps on disk (mmap): only the PLE / n-gram table may be."""
    for name, where in chat.placement.items():
        if name not in comp:
            raise EngineError(f"chat.placement: unknown component {name!r}")
        if where == "disk" and name != "ple":
            raise EngineError(f"chat.placement.{name}: only the PLE / n-gram table can be read from disk (mmap)")
        if where == "disk" and not comp[name]:
            raise EngineError(f"chat.placement.{name}: {arch.name} has no {name} table")
    return {c: comp[c] for c, w in chat.placement.items() if w == "disk"}


def _drafter(chat: ChatSpec, arch: Architecture, kvb: int, kv_name: str, comp: dict[str, int]) -> Drafter:
    try:
        return plan_drafter(chat, arch, kvb, kv_name, comp["mtp"])
    except SpeculativeError as exc:
        raise EngineError(str(exc)) from exc


def _weight_lines(
    chat: ChatSpec,
    arch: Architecture,
    quant: str,
    dtypes: dict[str, str],
    comp: dict[str, int],
    disk: dict[str, int],
    gpu: bool,
    notes: list[str],
) -> dict[str, int]:
    """The weights resident in the pool, one line a component, plus what the checkpoint holds beyond them."""
    lines: dict[str, int] = {}
    for name, nbytes in comp.items():
        # A text-only engine (limit_mm_per_prompt 0) does not load the vision tower (vLLM 0.26 on an H200).
        if nbytes and name not in disk and name != "mtp" and not (name == "vision" and chat.language_model_only):
            lines[f"weights.{name} ({dtypes[name]})"] = nbytes
    computed = sum(comp.values())
    on_disk_ckpt = safetensors_bytes(chat.model)
    published = arch.published.get(f"{quant}_checkpoint_bytes_without_ple")
    residual = 0
    if on_disk_ckpt and on_disk_ckpt > computed * 1.01:
        residual = on_disk_ckpt - computed
    elif published:
        residual = max(0, int(published) - (computed - comp["ple"]))
    if residual:
        lines["weights.checkpoint_residual"] = residual
        notes.append(
            f"chat: checkpoint holds {gib(residual)} more than the component model "
            "(tensors kept in higher precision, scales); planned as its own line"
        )
    if not gpu and on_disk_ckpt and DTYPE_BYTES.get(chat.dtype, 2) > DTYPE_BYTES.get(arch.config_dtype, 2):
        lines["runtime.upcast_load_residue"] = int(on_disk_ckpt * runtime.CPU_UPCAST_RESIDUE_FACTOR)
    return lines


def _kv_layout(chat: ChatSpec, arch: Architecture, drafter: Drafter, kvb: int, gpu: bool, notes: list[str]) -> KVLayout:
    """The block size vLLM will use (a pinned one kept or refused) and the bytes one token of it takes."""
    default_block = (
        runtime.BLOCK_SIZE_GPU if gpu else (runtime.BLOCK_SIZE_CPU_MLA if arch.uses_mla else runtime.BLOCK_SIZE_CPU)
    )
    block = chat.block_size or default_block
    if chat.block_size and not gpu and arch.uses_mla and chat.block_size != 16:
        raise EngineError(
            f"chat.block_size {chat.block_size} is pinned, but vLLM's CPU MLA kernel only runs "
            "with block_size 16 (it would override it); pin 16 or unpin"
        )
    conv_b = DTYPE_BYTES["bfloat16" if chat.dtype == "auto" else chat.dtype]
    ssm_name = arch.ssm_dtype if chat.mamba_ssm_cache_dtype == "auto" else chat.mamba_ssm_cache_dtype
    ssm_b = DTYPE_BYTES[ssm_name]
    if arch.is_hybrid:
        hybrid_block = arch.hybrid_attention_block(kvb, conv_b, ssm_b, max(16, block), drafter.k)
        if chat.block_size and chat.block_size < hybrid_block:
            raise EngineError(
                f"chat.block_size {chat.block_size} is pinned, but vLLM raises the attention block "
                f"of {arch.name} to {hybrid_block} tokens so one page covers a layer's recurrent "
                "state; pin at least that or unpin"
            )
        if hybrid_block > block:
            notes.append(
                f"chat: attention block raised {block} -> {hybrid_block} tokens to match the "
                f"{gib(arch.state_bytes_per_layer(conv_b, ssm_b, drafter.k))} state page (as vLLM does)"
            )
        block = max(block, hybrid_block)
    groups = _kv_groups(arch, drafter, kvb)
    # Empty layer slots of short attention groups still take their page in every block.
    pad_tok = groups.padding("attention") * arch.kv_bytes_per_token_per_layer(kvb) if groups.groups else 0
    if groups.groups and drafter.architecture is not None:
        pad_tok += groups.padding("drafter") * drafter.architecture.kv_bytes_per_token_per_layer(kvb)
    return KVLayout(
        block=block,
        kv_dtype_bytes=kvb,
        conv_dtype_bytes=conv_b,
        ssm_dtype=ssm_name,
        target_per_token=arch.kv_bytes_per_token(kvb),
        indexer_per_token=arch.indexer_bytes_per_token(),
        padding_per_token=pad_tok,
        groups=groups,
    )


def _kv_pool(chat: ChatSpec, block: int, block_bytes: int) -> KVPool:
    """The KV pool: blocks for max_num_seqs x expected tokens (at least one max_model_len request), or the
    pinned bytes; refused if it cannot hold one request of max_model_len."""
    if chat.kv_cache_bytes == "auto":
        num_blocks = cdiv(max(chat.max_num_seqs * chat.expected_tokens_per_seq, chat.max_model_len), block)
        pool_bytes = num_blocks * block_bytes
    else:
        pool_bytes = chat.kv_cache_bytes
        num_blocks = pool_bytes // block_bytes
    tokens = num_blocks * block
    if tokens < chat.max_model_len:
        raise EngineError(
            f"the KV pool holds {tokens:,} tokens, fewer than max_model_len "
            f"{chat.max_model_len:,}: raise chat.kv_cache_bytes to at least "
            f"{gib(cdiv(chat.max_model_len, block) * block_bytes)} or lower max_model_len"
        )
    # vLLM logs num_blocks / blocks-per-request(max_model_len) x max_model_len (kv_cache_utils.py).
    logged = int(num_blocks / cdiv(chat.max_model_len, block) * chat.max_model_len)
    return KVPool(num_blocks=num_blocks, pool_bytes=pool_bytes, tokens=tokens, logged_tokens=logged)


def _max_num_seqs(chat: ChatSpec, kv: KVPool, block: int, block_bytes: int, notes: list[str]) -> int:
    """chat.max_num_seqs, lowered to the sequences of expected_tokens_per_seq the KV pool holds (refused when
    both are pinned)."""
    fits = kv.tokens // chat.expected_tokens_per_seq
    if fits >= chat.max_num_seqs:
        return chat.max_num_seqs
    if pinned(chat, "max_num_seqs") and chat.kv_cache_bytes != "auto":
        raise EngineError(
            f"chat.max_num_seqs {chat.max_num_seqs} is pinned but the pinned KV pool ({gib(kv.pool_bytes)}, "
            f"{kv.tokens:,} tokens) holds {fits} sequences of {chat.expected_tokens_per_seq:,} tokens: raise "
            f"chat.kv_cache_bytes to {gib(cdiv(chat.max_num_seqs * chat.expected_tokens_per_seq, block) * block_bytes)} "
            f"or lower max_num_seqs / expected_tokens_per_seq"
        )
    notes.append(
        f"chat: max_num_seqs {chat.max_num_seqs} -> {max(1, fits)} (KV pool holds {fits} sequences of "
        f"{chat.expected_tokens_per_seq:,} tokens)"
    )
    return max(1, fits)


def _kv_pool_lines(layout: KVLayout, kv: KVPool, drafter: Drafter) -> dict[str, int]:
    """The KV pool's lines: the target's attention, the indexer, the drafter's KV, group padding, unused tail."""
    tokens = kv.num_blocks * layout.block
    lines = {"kv_pool.attention": tokens * layout.target_per_token}
    if layout.indexer_per_token:
        lines["kv_pool.indexer (bf16)"] = tokens * layout.indexer_per_token
    if drafter.kv_bytes_per_token:
        lines[f"drafter.kv ({drafter.method})"] = tokens * drafter.kv_bytes_per_token
    if layout.padding_per_token:
        empty = layout.groups.padding("attention") + layout.groups.padding("drafter")
        lines[f"kv_pool.group_padding ({empty} empty layer slots)"] = tokens * layout.padding_per_token
    used = tokens * layout.per_token(drafter)
    if kv.pool_bytes > used:
        lines["kv_pool.unused_tail"] = kv.pool_bytes - used
    return lines


def _mamba_cache_mode(chat: ChatSpec) -> str:
    """`auto`: align the recurrent state to blocks when prefix caching is on (a checkpoint per block)."""
    if chat.mamba_cache_mode != "auto":
        return chat.mamba_cache_mode
    return "align" if chat.enable_prefix_caching else "none"


def _state_lines(
    chat: ChatSpec, arch: Architecture, layout: KVLayout, drafter: Drafter, seqs: int, mamba_mode: str
) -> dict[str, int]:
    """Per-sequence state beside the KV pool: a hybrid's recurrent state (and the drafter's copies, the align
    checkpoint, the page padding), and the sliding-window layers' KV."""
    state_seq = arch.state_bytes_per_sequence(layout.conv_dtype_bytes, DTYPE_BYTES[layout.ssm_dtype], drafter.k)
    lines = {}
    if state_seq:
        lines["recurrent_state"] = state_seq * seqs
        if drafter.state_blocks:
            lines[f"drafter.recurrent_state (x{drafter.state_blocks} spec blocks)"] = (
                state_seq * seqs * drafter.state_blocks
            )
        if mamba_mode == "align":
            lines["recurrent_state.align_checkpoint"] = state_seq * seqs
        # Each state block is a full page per layer slot: the state page padded to the attention
        # page, times the group size (vLLM pads the state page and the short groups alike).
        page = layout.block * arch.kv_bytes_per_token_per_layer(layout.kv_dtype_bytes)
        pad_seq = layout.groups.slots("state") * page - state_seq
        blocks_per_seq = 1 + drafter.state_blocks + (mamba_mode == "align")
        if pad_seq > 0:
            lines[
                f"recurrent_state.page_padding ({layout.groups.padding('state')} empty slots, x{blocks_per_seq} blocks)"
            ] = pad_seq * seqs * blocks_per_seq
    sliding = (
        arch.sliding_bytes_per_sequence(
            layout.kv_dtype_bytes, chat.max_num_batched_tokens, chat.max_model_len, layout.block
        )
        * seqs
    )
    if sliding:
        lines["kv_pool.sliding_window"] = sliding
    return lines


def _compute_and_runtime_lines(
    chat: ChatSpec, arch: Architecture, drafter: Drafter, seqs: int, gpu: bool
) -> dict[str, int]:
    """The drafter's weights, a step's activations, and the engine's processes (driver, EngineCore, Worker,
    CUDA context and graphs on a GPU)."""
    lines = {}
    if drafter.weight_bytes:
        lines[f"drafter.weights ({drafter.method})"] = drafter.weight_bytes
    act = _activations(chat, arch, seqs, drafter.k) if chat.activation_bytes == "auto" else chat.activation_bytes
    if gpu and chat.activation_bytes == "auto":  # vLLM's measured torch peak on a GPU (runtime.py)
        act = int(act * runtime.GPU_ACTIVATION_FACTOR)
        if drafter.architecture is not None:
            lines[f"drafter.activations ({drafter.method})"] = int(act * runtime.GPU_DRAFTER_ACTIVATION_SHARE)
    lines["activations"] = act
    lines["runtime.driver (LLMServer replica)"] = runtime.VLLM_DRIVER
    lines["runtime.engine_core"] = runtime.VLLM_ENGINE_CORE
    lines["runtime.worker"] = runtime.VLLM_WORKER_GPU if gpu else runtime.VLLM_WORKER
    if not gpu and drafter.method == "ngram":
        lines["runtime.ngram_proposer"] = runtime.CPU_NGRAM_PROPOSER
    if not gpu and chat.on_demand is not None:  # kept by its replica, asleep too (on_demand_plan.py)
        lines["runtime.driver_wake_residue"] = runtime.CPU_DRIVER_WAKE_RESIDUE
    lines["runtime.traffic_growth"] = runtime.VLLM_TRAFFIC_GROWTH
    if gpu:
        lines["cuda_context.worker"] = runtime.CUDA_CONTEXT
        if not chat.enforce_eager:
            lines["cuda_graphs"] = runtime.CUDA_GRAPHS
    return lines


def _settings_not_passed(chat: ChatSpec, gpu: bool) -> list[str]:
    """Notes on the chat settings that change what vLLM is told: random weights, GPU-only knobs on a CPU."""
    notes = []
    if chat.load_format != "auto":
        notes.append(f"chat: load_format {chat.load_format}: random weights, for plan validation and benchmarks only")
    if not gpu:
        for knob in ("cuda_graph_capture_sizes", "gpu_memory_utilization"):
            if getattr(chat, knob) is not None:
                notes.append(
                    f"chat.{knob} is ignored on CPU (vLLM CPU has no CUDA graphs and sizes KV "
                    "from kv_cache_memory_bytes); not passed"
                )
    return notes


def _ple_switch_env(chat: ChatSpec, disk: dict[str, int], notes: list[str]) -> dict[str, str]:
    """The plan keeps a disk-placed table out of the pool only if the engine is told to (ple_switch.py)."""
    if not disk:
        return {}
    try:
        env = ple_disk_switch(chat.vllm_build).env
    except PleSwitchError as exc:
        raise EngineError(str(exc)) from exc
    notes.append(
        f"chat: PLE on disk ({', '.join(f'{k}={v}' for k, v in env.items())}, vLLM build "
        f"{chat.vllm_build}): the page cache holds its hot rows "
        f"(headroom {gib(chat.disk_page_cache_bytes)} kept free in the pool)"
    )
    return dict(env)


def vllm_logged_kv_tokens(
    kv_cache_memory_bytes: int,
    max_model_len: int,
    block: int,
    groups: KVGroups,
    page_bytes_per_token: int,
    bytes_per_token: int,
    state_blocks_per_request: int,
) -> int:
    """The "KV cache size: N tokens" vLLM logs for a KV cache of kv_cache_memory_bytes (v1/core/kv_cache_utils.py):
    the blocks it can make, over the blocks one request of max_model_len needs, times max_model_len.
    Single-spec models: a block is block x bytes/token. Hybrids: a block is one page per layer slot of a
    group (group_size tensors, each one page per block); a request takes cdiv(max_model_len, block) blocks in
    each attention group and state_blocks_per_request (1, + one per speculative slot, + one to align) in each
    state group. Checked on an H200 (vLLM 0.26, Qwen3.8-27B at 8 GiB: 97,718 tokens, 28,912 with DSpark k=7)."""
    if not groups.groups:
        num_blocks = kv_cache_memory_bytes // (block * bytes_per_token)
        return int(num_blocks / cdiv(max_model_len, block) * max_model_len)
    num_blocks = kv_cache_memory_bytes // (block * page_bytes_per_token * groups.group_size)
    per_request = sum(
        state_blocks_per_request if g.kind == "state" else cdiv(max_model_len, block) for g in groups.groups
    )
    return int(num_blocks / per_request * max_model_len)
