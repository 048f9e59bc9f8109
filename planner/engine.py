"""The chat engine's budget: weights, KV pool, recurrent state, drafter, activations, runtime, vLLM args.

Values pinned in the profile are kept or refused with the reason (PlanError); derived values are
reported in the plan's notes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from planner import runtime
from planner.architecture import DTYPE_BYTES, Architecture, read_architecture
from planner.engine_threads import cpu_threads, omp_bind
from planner.errors import EngineError
from planner.kvgroups import KVGroups, kv_cache_groups
from planner.graphs import compilation_config
from planner.outputs import EngineArgs
from planner.ple_switch import PleSwitchError, ple_disk_switch
from planner.profile import ChatSpec, PoolSpec, pinned
from planner.speculative import Drafter, SpeculativeError, plan_drafter
from planner.step_worker import STEP_THREADS_WORKER, StepWorkerSettings
from planner.units import cdiv, gib
from planner.weights import DEFAULT_QUANTIZED, QUANT_METHODS, component_bytes, component_dtypes, safetensors_bytes


@dataclass
class EnginePlan:
    arch: Architecture
    breakdown: dict[str, int]
    vllm: EngineArgs
    env: dict[str, str]
    facts: dict
    component_bytes: dict[str, int]
    disk_components: dict[str, int]
    page_cache_bytes: int
    drafter: Drafter
    notes: list[str] = field(default_factory=list)


def _quantization(chat: ChatSpec, arch: Architecture, notes: list[str]) -> str:
    if chat.quantization != "auto":
        return chat.quantization
    q = {"modelopt_fp4": "nvfp4", "modelopt": "fp8", "compressed-tensors": "int4", "gptq": "int4"}.get(
        arch.quantization, arch.quantization)
    if q not in QUANT_METHODS:
        notes.append(f"chat: unknown quant_method {arch.quantization!r}; planning weights unquantized")
        return "none"
    return q


def _activations(chat: ChatSpec, a: Architecture, seqs: int, k: int) -> int:
    """Peak live activations of one step: per batched token, the widest layer's tensors in the model
    dtype; plus fp32 logits and probabilities for every sampled position."""
    q = a.num_attention_heads * a.head_dim * (2 if a.attn_output_gate else 1)
    kv = 2 * a.num_kv_heads * a.head_dim
    mlp = max(a.intermediate_size if a.moe_layers < a.num_layers else 0,
              a.experts_per_token * a.moe_intermediate_size + a.shared_expert_intermediate_size)
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


def plan_engine(chat: ChatSpec, pool: PoolSpec, cpus: float, total: int, other_threads: int,
                cpu_native_bf16: bool = True) -> EnginePlan:
    notes: list[str] = []
    if chat.dtype == "auto":
        chat = chat.model_copy(update={"dtype": resolved_dtype(chat, pool.gpu, cpu_native_bf16)})
        if not pool.gpu:
            notes.append(f"dtype auto -> {chat.dtype}: this CPU "
                         f"{'computes bfloat16 natively' if cpu_native_bf16 else 'emulates bfloat16'}")
    arch = read_architecture(chat.model, chat.architecture)
    gpu = pool.gpu
    quant = _quantization(chat, arch, notes)
    recipe = tuple(arch.published.get("quantized_components", DEFAULT_QUANTIZED))
    try:
        dtypes = component_dtypes(arch, quant, chat.dtype, chat.component_dtypes, recipe)
    except ValueError as exc:
        raise EngineError(str(exc)) from exc
    comp = component_bytes(arch, dtypes)
    for name, where in chat.placement.items():
        if name not in comp:
            raise EngineError(f"chat.placement: unknown component {name!r}")
        if where == "disk" and name != "ple":
            raise EngineError(f"chat.placement.{name}: only the PLE / n-gram table can be read from disk (mmap)")
        if where == "disk" and not comp[name]:
            raise EngineError(f"chat.placement.{name}: {arch.name} has no {name} table")
    disk = {c: comp[c] for c, w in chat.placement.items() if w == "disk"}
    page_cache = chat.disk_page_cache_bytes * len(disk)

    kvb, kv_name = _kv_dtype(chat)
    try:
        drafter = plan_drafter(chat, arch, kvb, kv_name, comp["mtp"])
    except SpeculativeError as exc:
        raise EngineError(str(exc)) from exc

    breakdown: dict[str, int] = {}
    for name, nbytes in comp.items():
        # A text-only engine (limit_mm_per_prompt 0) does not load the vision tower (vLLM 0.26 on an H200).
        if nbytes and name not in disk and name != "mtp" and not (name == "vision" and chat.language_model_only):
            breakdown[f"weights.{name} ({dtypes[name]})"] = nbytes
    computed = sum(comp.values())
    on_disk_ckpt = safetensors_bytes(chat.model)
    published = arch.published.get(f"{quant}_checkpoint_bytes_without_ple")
    residual = 0
    if on_disk_ckpt and on_disk_ckpt > computed * 1.01:
        residual = on_disk_ckpt - computed
    elif published:
        residual = max(0, int(published) - (computed - comp["ple"]))
    if residual:
        breakdown["weights.checkpoint_residual"] = residual
        notes.append(f"chat: checkpoint holds {gib(residual)} more than the component model "
                     "(tensors kept in higher precision, scales); planned as its own line")
    if not gpu and on_disk_ckpt and DTYPE_BYTES.get(chat.dtype, 2) > DTYPE_BYTES.get(arch.config_dtype, 2):
        breakdown["runtime.upcast_load_residue"] = int(on_disk_ckpt * runtime.CPU_UPCAST_RESIDUE_FACTOR)

    # --- blocks, KV, state ---------------------------------------------------------------------
    default_block = runtime.BLOCK_SIZE_GPU if gpu else (
        runtime.BLOCK_SIZE_CPU_MLA if arch.uses_mla else runtime.BLOCK_SIZE_CPU)
    block = chat.block_size or default_block
    if chat.block_size and not gpu and arch.uses_mla and chat.block_size != 16:
        raise EngineError(f"chat.block_size {chat.block_size} is pinned, but vLLM's CPU MLA kernel only runs "
                          "with block_size 16 (it would override it); pin 16 or unpin")
    conv_b = DTYPE_BYTES["bfloat16" if chat.dtype == "auto" else chat.dtype]
    ssm_name = arch.ssm_dtype if chat.mamba_ssm_cache_dtype == "auto" else chat.mamba_ssm_cache_dtype
    ssm_b = DTYPE_BYTES[ssm_name]
    if arch.is_hybrid:
        hybrid_block = arch.hybrid_attention_block(kvb, conv_b, ssm_b, max(16, block), drafter.k)
        if chat.block_size and chat.block_size < hybrid_block:
            raise EngineError(f"chat.block_size {chat.block_size} is pinned, but vLLM raises the attention block "
                              f"of {arch.name} to {hybrid_block} tokens so one page covers a layer's recurrent "
                              "state; pin at least that or unpin")
        if hybrid_block > block:
            notes.append(f"chat: attention block raised {block} -> {hybrid_block} tokens to match the "
                         f"{gib(arch.state_bytes_per_layer(conv_b, ssm_b, drafter.k))} state page (as vLLM does)")
        block = max(block, hybrid_block)
    target_tok = arch.kv_bytes_per_token(kvb)
    indexer_tok = arch.indexer_bytes_per_token()
    groups = _kv_groups(arch, drafter, kvb)
    # Empty layer slots of short attention groups still take their page in every block.
    pad_tok = groups.padding("attention") * arch.kv_bytes_per_token_per_layer(kvb) if groups.groups else 0
    if groups.groups and drafter.architecture is not None:
        pad_tok += groups.padding("drafter") * drafter.architecture.kv_bytes_per_token_per_layer(kvb)
    per_token = target_tok + indexer_tok + drafter.kv_bytes_per_token + pad_tok
    block_bytes = block * per_token

    seqs = chat.max_num_seqs
    if chat.kv_cache_bytes == "auto":
        tokens = max(seqs * chat.expected_tokens_per_seq, chat.max_model_len)
        num_blocks = cdiv(tokens, block)
        kv_pool = num_blocks * block_bytes
    else:
        kv_pool = chat.kv_cache_bytes
        num_blocks = kv_pool // block_bytes
    kv_tokens_raw = num_blocks * block
    # vLLM logs num_blocks / blocks-per-request(max_model_len) x max_model_len (kv_cache_utils.py).
    kv_tokens = int(num_blocks / cdiv(chat.max_model_len, block) * chat.max_model_len)
    if kv_tokens_raw < chat.max_model_len:
        raise EngineError(f"the KV pool holds {kv_tokens_raw:,} tokens, fewer than max_model_len "
                          f"{chat.max_model_len:,}: raise chat.kv_cache_bytes to at least "
                          f"{gib(cdiv(chat.max_model_len, block) * block_bytes)} or lower max_model_len")
    fit_seqs = kv_tokens_raw // chat.expected_tokens_per_seq
    if fit_seqs < seqs:
        if pinned(chat, "max_num_seqs") and chat.kv_cache_bytes != "auto":
            raise EngineError(
                f"chat.max_num_seqs {seqs} is pinned but the pinned KV pool ({gib(kv_pool)}, {kv_tokens_raw:,} "
                f"tokens) holds {fit_seqs} sequences of {chat.expected_tokens_per_seq:,} tokens: raise "
                f"chat.kv_cache_bytes to {gib(cdiv(seqs * chat.expected_tokens_per_seq, block) * block_bytes)} "
                f"or lower max_num_seqs / expected_tokens_per_seq")
        notes.append(f"chat: max_num_seqs {seqs} -> {max(1, fit_seqs)} (KV pool holds {fit_seqs} sequences of "
                     f"{chat.expected_tokens_per_seq:,} tokens)")
        seqs = max(1, fit_seqs)
    if chat.expected_concurrency and chat.expected_concurrency > seqs:
        raise EngineError(f"chat.expected_concurrency {chat.expected_concurrency} exceeds max_num_seqs {seqs}")

    breakdown["kv_pool.attention"] = num_blocks * block * target_tok
    if indexer_tok:
        breakdown["kv_pool.indexer (bf16)"] = num_blocks * block * indexer_tok
    if drafter.kv_bytes_per_token:
        breakdown[f"drafter.kv ({drafter.method})"] = num_blocks * block * drafter.kv_bytes_per_token
    if pad_tok:
        empty = groups.padding("attention") + groups.padding("drafter")
        breakdown[f"kv_pool.group_padding ({empty} empty layer slots)"] = \
            num_blocks * block * pad_tok
    if kv_pool > num_blocks * block_bytes:
        breakdown["kv_pool.unused_tail"] = kv_pool - num_blocks * block_bytes
    state_seq = arch.state_bytes_per_sequence(conv_b, ssm_b, drafter.k)
    mamba_mode = chat.mamba_cache_mode
    if mamba_mode == "auto":
        mamba_mode = "align" if chat.enable_prefix_caching else "none"
    state_lines = {}
    if state_seq:
        state_lines["recurrent_state"] = state_seq * seqs
        if drafter.state_blocks:
            state_lines[f"drafter.recurrent_state (x{drafter.state_blocks} spec blocks)"] = \
                state_seq * seqs * drafter.state_blocks
        if mamba_mode == "align":
            state_lines["recurrent_state.align_checkpoint"] = state_seq * seqs
        # Each state block is a full page per layer slot: the state page padded to the attention
        # page, times the group size (vLLM pads the state page and the short groups alike).
        page = block * arch.kv_bytes_per_token_per_layer(kvb)
        pad_seq = groups.slots("state") * page - state_seq
        blocks_per_seq = 1 + drafter.state_blocks + (mamba_mode == "align")
        if pad_seq > 0:
            state_lines[f"recurrent_state.page_padding ({groups.padding('state')} empty slots, "
                        f"x{blocks_per_seq} blocks)"] = pad_seq * seqs * blocks_per_seq
    sliding = arch.sliding_bytes_per_sequence(kvb, chat.max_num_batched_tokens, chat.max_model_len, block) * seqs
    if sliding:
        state_lines["kv_pool.sliding_window"] = sliding
    breakdown.update(state_lines)
    kv_cache_memory_bytes = kv_pool + sum(state_lines.values())

    if drafter.weight_bytes:
        breakdown[f"drafter.weights ({drafter.method})"] = drafter.weight_bytes
    act = _activations(chat, arch, seqs, drafter.k) if chat.activation_bytes == "auto" else chat.activation_bytes
    if gpu and chat.activation_bytes == "auto":  # vLLM's measured torch peak on a GPU (runtime.py)
        act = int(act * runtime.GPU_ACTIVATION_FACTOR)
        if drafter.architecture is not None:
            breakdown[f"drafter.activations ({drafter.method})"] = int(act * runtime.GPU_DRAFTER_ACTIVATION_SHARE)
    breakdown["activations"] = act
    breakdown["runtime.driver (LLMServer replica)"] = runtime.VLLM_DRIVER
    breakdown["runtime.engine_core"] = runtime.VLLM_ENGINE_CORE
    breakdown["runtime.worker"] = runtime.VLLM_WORKER_GPU if gpu else runtime.VLLM_WORKER
    if not gpu and drafter.method == "ngram":
        breakdown["runtime.ngram_proposer"] = runtime.CPU_NGRAM_PROPOSER
    breakdown["runtime.traffic_growth"] = runtime.VLLM_TRAFFIC_GROWTH
    if gpu:
        breakdown["cuda_context.worker"] = runtime.CUDA_CONTEXT
        if not chat.enforce_eager:
            breakdown["cuda_graphs"] = runtime.CUDA_GRAPHS

    # --- vLLM engine arguments -------------------------------------------------------------------
    args = {
        "dtype": chat.dtype, "max_model_len": chat.max_model_len, "max_num_seqs": seqs,
        "max_num_batched_tokens": chat.max_num_batched_tokens, "kv_cache_memory_bytes": kv_cache_memory_bytes,
        "enable_prefix_caching": chat.enable_prefix_caching, "block_size": chat.block_size or None,
        "kv_cache_dtype": chat.kv_cache_dtype if chat.kv_cache_dtype != "auto" else None,
        "speculative_config": drafter.vllm_config or None,
    }
    if quant not in ("none",) and chat.quantization != "auto":
        args["quantization"] = {"nvfp4": "modelopt_fp4", "int4": "compressed-tensors"}.get(quant, quant)
    if arch.is_hybrid:
        args["mamba_cache_mode"] = mamba_mode
        args["mamba_ssm_cache_dtype"] = ssm_name if ssm_name in ("float32", "bfloat16", "float16") else "auto"
    if chat.enforce_eager is not None:
        # GPU: no CUDA graphs. CPU: no torch.compile (same answers, 5-11% slower decode, 50 s less to
        # a cold start on 2 cores; docs/BENCHMARKS.md section 1.1).
        args["enforce_eager"] = chat.enforce_eager
    if chat.load_format != "auto":
        args["load_format"] = chat.load_format
        notes.append(f"chat: load_format {chat.load_format}: random weights, for plan validation and benchmarks only")
    if chat.gdn_prefill_backend != "auto":
        args["additional_config"] = {"gdn_prefill_backend": chat.gdn_prefill_backend}
    if chat.language_model_only:
        args["limit_mm_per_prompt"] = {"image": 0, "video": 0}
    if gpu:
        args["compilation_config"] = compilation_config(chat, drafter, seqs)
    else:
        for knob in ("cuda_graph_capture_sizes", "gpu_memory_utilization"):
            if getattr(chat, knob) is not None:
                notes.append(f"chat.{knob} is ignored on CPU (vLLM CPU has no CUDA graphs and sizes KV "
                             "from kv_cache_memory_bytes); not passed")
    disk_env: dict[str, str] = {}
    if disk:
        # The plan keeps the table out of the pool only if the engine is told to (ple_switch.py).
        try:
            disk_env = ple_disk_switch(chat.vllm_build).env
        except PleSwitchError as exc:
            raise EngineError(str(exc)) from exc
        notes.append(f"chat: PLE on disk ({', '.join(f'{k}={v}' for k, v in disk_env.items())}, vLLM build "
                     f"{chat.vllm_build}): the page cache holds its hot rows "
                     f"(headroom {gib(chat.disk_page_cache_bytes)} kept free in the pool)")

    if chat.omp_threads and chat.omp_threads > cpus:
        raise EngineError(f"chat.omp_threads {chat.omp_threads} is pinned but the pool has {cpus:g} CPUs")
    one_rank = chat.tensor_parallel_size * chat.pipeline_parallel_size == 1
    omp, decode_omp = cpu_threads(chat, cpus, other_threads, step_threads=one_rank and not gpu)
    if gpu and not chat.omp_threads:
        omp = decode_omp = min(omp, 4)
    env = {"OMP_NUM_THREADS": str(omp), "MKL_NUM_THREADS": str(omp), "TOKENIZERS_PARALLELISM": "false"}
    if not gpu:
        env["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind(chat.omp_bind, omp) if one_rank else chat.omp_bind
        args["worker_cls"] = STEP_THREADS_WORKER
        env |= StepWorkerSettings(narrow_step_threads=decode_omp if decode_omp < omp else None,
                                  wide_step_tokens=chat.wide_step_tokens, idle_spin_s=chat.worker_idle_spin_s).as_env()
        if omp > 1:
            # The ngram proposer's numba kernels on numba's OpenMP layer cost a second core all its gain
            # (800-token prefill 3.1 s against 1.7 s on its workqueue layer; docs/BENCHMARKS.md 2.5).
            env["NUMBA_THREADING_LAYER"] = "workqueue"
        # vllm-cpu 0.32 cannot reload its own AOT artifact ("'function' object has no attribute
        # 'finalize_loading'") and recompiles on every start; without AOT, Inductor's cache is reused.
        env["VLLM_USE_AOT_COMPILE"] = "0"
        if chat.onednn_primitive_cache is not None:
            # oneDNN's global cache fills with a primitive per batch size seen: ~290 MiB of the Worker's heap
            # over ~570 requests of varied load, never freed (docs/STRESS.md, 'oneDNN's cache').
            env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = str(chat.onednn_primitive_cache)
    if gpu and arch.is_hybrid:
        env["VLLM_KV_CACHE_LAYOUT"] = "BLHNC"  # mixed attention/state page sizes (docs/DESIGN-FACTS.md section 3b)
    env.update(disk_env)
    facts = {
        "vllm_kv_tokens": vllm_logged_kv_tokens(kv_cache_memory_bytes, chat.max_model_len, block, groups,
                                                arch.kv_bytes_per_token_per_layer(kvb), per_token,
                                                1 + drafter.state_blocks + (mamba_mode == "align")),
        "kv_bytes_per_token": per_token, "target_kv_bytes_per_token": target_tok,
        "indexer_bytes_per_token": indexer_tok, "drafter_kv_bytes_per_token": drafter.kv_bytes_per_token,
        "state_bytes_per_sequence": state_seq, "kv_pool_tokens": kv_tokens, "block_size": block,
        "num_blocks": num_blocks, "max_num_seqs": seqs, "kv_cache_memory_bytes": kv_cache_memory_bytes,
        "weight_bytes": sum(v for k, v in breakdown.items() if k.startswith("weights.")),
        "drafter_weight_bytes": drafter.weight_bytes, "omp_threads": omp, "decode_omp_threads": decode_omp,
        "omp_bind": env.get("VLLM_CPU_OMP_THREADS_BIND"), "quantization": quant,
        "speculative_method": drafter.method, "kv_group_size": groups.group_size,
        "kv_group_layers": [f"{g.kind}:{g.layers}" for g in groups.groups],
        "state_pool_bytes_per_sequence": groups.slots("state") * block * arch.kv_bytes_per_token_per_layer(kvb)
        if state_seq else 0,
    }
    return EnginePlan(arch, breakdown, EngineArgs(**args), env, facts, comp, disk, page_cache, drafter, notes)


def vllm_logged_kv_tokens(kv_cache_memory_bytes: int, max_model_len: int, block: int, groups: KVGroups,
                          page_bytes_per_token: int, bytes_per_token: int, state_blocks_per_request: int) -> int:
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
    per_request = sum(state_blocks_per_request if g.kind == "state" else cdiv(max_model_len, block)
                      for g in groups.groups)
    return int(num_blocks / per_request * max_model_len)


def utilization_for(planned: int, total: int) -> float:
    """Smallest 4-decimal utilization whose util x total covers the engine's planned bytes."""
    return math.ceil(planned / total * 10_000) / 10_000
