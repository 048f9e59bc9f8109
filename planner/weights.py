"""Weight bytes by component, dtype and quantization, for dense and MoE models (all experts resident).

Parameters per component (per model; h = hidden, L = layers of that kind):
  embed        vocab x h            lm_head   vocab x h (0 when tied)
  attention    q h x heads x hd (x2 with an output gate) + k,v h x kv x hd + o heads x hd x h; MLA:
               q (via q_lora) + kv_a h x (rank+rope) + kv_b rank x heads x (nope+v) + o
  linear_attention (GDN)  h x (2 kh kd + 2 vh vd + 2 vh) + vh vd x h + conv (2 kh kd + vh vd) x kernel
  mlp          3 x h x intermediate on dense layers
  experts      moe_layers x E x 3 x h x moe_intermediate;  shared_experts likewise;  router h x E
  mtp          one decoder layer + fc 2h x h, loaded only with method mtp (drafter line)
  ple          rows x dim (an n-gram / per-layer embedding table), placed in the pool or on disk
  vision       the vision tower's parameters
Bytes per parameter: bf16/fp16 2; fp8 1; nvfp4 0.5 + 1/16 (one fp8 scale per 16 values);
int4/awq 0.5 + 4/128 (bf16 scale and zero per 128); int3 0.375 + 4/128; mxfp4 0.5 + 1/32.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

from planner.architecture import Architecture

BYTES_PER_PARAM = {
    "float32": Fraction(4),
    "bfloat16": Fraction(2),
    "float16": Fraction(2),
    "bf16": Fraction(2),
    "fp16": Fraction(2),
    "fp8": Fraction(1),
    "nvfp4": Fraction(1, 2) + Fraction(1, 16),
    "int4": Fraction(1, 2) + Fraction(4, 128),
    "awq": Fraction(1, 2) + Fraction(4, 128),
    "int3": Fraction(3, 8) + Fraction(4, 128),
    "mxfp4": Fraction(1, 2) + Fraction(1, 32),
}
QUANT_METHODS = ("none", "fp8", "nvfp4", "int4", "awq", "int3", "mxfp4")
# Components a quantized checkpoint stores quantized unless the bundled facts say otherwise.
DEFAULT_QUANTIZED = ("attention", "linear_attention", "mlp", "experts", "shared_experts")
MAIN_COMPONENTS = (
    "embed",
    "lm_head",
    "attention",
    "linear_attention",
    "mlp",
    "experts",
    "shared_experts",
    "router",
    "norms",
)


def _attention_params(a: Architecture) -> int:
    h = a.hidden_size
    if a.uses_mla:
        qk = a.qk_nope_head_dim + a.qk_rope_head_dim
        q = (
            h * a.q_lora_rank + a.q_lora_rank * a.num_attention_heads * qk
            if a.q_lora_rank
            else h * a.num_attention_heads * qk
        )
        kv = h * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank * a.num_attention_heads * (
            a.qk_nope_head_dim + a.v_head_dim
        )
        return q + kv + a.num_attention_heads * a.v_head_dim * h
    q = h * a.num_attention_heads * a.head_dim * (2 if a.attn_output_gate else 1)
    kv = 2 * h * a.num_kv_heads * a.head_dim
    return q + kv + a.num_attention_heads * a.head_dim * h


def _linear_params(a: Architecture) -> int:
    h = a.hidden_size
    if a.lin_kind == "gdn":
        kdim, vdim = a.lin_k_heads * a.lin_k_dim, a.lin_v_heads * a.lin_v_dim
        return (
            h * (2 * kdim + 2 * vdim + 2 * a.lin_v_heads)
            + vdim * h
            + (2 * kdim + vdim) * a.conv_kernel
            + 2 * a.lin_v_heads
            + a.lin_v_dim
        )
    if a.lin_kind == "mamba2":
        inner = a.lin_v_heads * a.lin_v_dim
        gs = 2 * a.mamba_groups * a.mamba_state
        return h * (2 * inner + gs + a.lin_v_heads) + (inner + gs) * a.conv_kernel + inner * h + 3 * a.lin_v_heads
    return 0


def _moe_layer(a: Architecture) -> tuple[int, int, int]:
    h = a.hidden_size
    experts = a.num_experts * 3 * h * a.moe_intermediate_size
    shared = 3 * h * a.shared_expert_intermediate_size
    router = h * a.num_experts + (h if a.shared_expert_intermediate_size else 0)
    return experts, shared, router


def component_params(a: Architecture) -> dict[str, int]:
    """Parameter count per component (the MTP head and PLE separately)."""
    h = a.hidden_size
    experts, shared, router = _moe_layer(a)
    dense_layers = a.num_layers - a.moe_layers
    mtp_mlp = experts + shared + router if a.num_experts else 3 * h * a.intermediate_size
    return {
        "embed": a.vocab_size * h,
        "lm_head": 0 if a.tie_word_embeddings else a.vocab_size * h,
        "attention": a.attention_layers * _attention_params(a),
        "linear_attention": a.linear_layers * _linear_params(a),
        "mlp": dense_layers * 3 * h * a.intermediate_size,
        "experts": a.moe_layers * experts,
        "shared_experts": a.moe_layers * shared,
        "router": a.moe_layers * router,
        "norms": a.num_layers * 2 * h + h,
        "mtp": a.mtp_layers * (_attention_params(a) + mtp_mlp + 2 * h * h + 4 * h),
        "ple": a.ple_rows * a.ple_dim,
        "vision": a.vision_params,
    }


def component_dtypes(
    a: Architecture, quantization: str, model_dtype: str, overrides: dict[str, str], quantized: tuple[str, ...]
) -> dict[str, str]:
    """dtype per component: quantized parts in the checkpoint's format, the rest in the model dtype."""
    base = "bfloat16" if model_dtype in ("auto", "float32") and quantization != "none" else model_dtype
    base = "bfloat16" if base == "auto" else base
    dtypes = {}
    for comp in component_params(a):
        if quantization != "none" and comp in quantized:
            dtypes[comp] = quantization
        elif comp == "ple" and quantization != "none":
            dtypes[comp] = (
                "fp8"  # NVFP4 checkpoints of Flash-Next ship the PLE in fp8 (docs/DESIGN-FACTS.md section 3b)
            )
        else:
            dtypes[comp] = base
    for comp, dtype in overrides.items():
        if comp not in dtypes:
            raise ValueError(f"chat.component_dtypes: unknown component {comp!r}; known: {', '.join(dtypes)}")
        if dtype not in BYTES_PER_PARAM:
            raise ValueError(
                f"chat.component_dtypes.{comp}: unknown dtype {dtype!r}; known: {', '.join(BYTES_PER_PARAM)}"
            )
        dtypes[comp] = dtype
    return dtypes


def component_bytes(a: Architecture, dtypes: dict[str, str]) -> dict[str, int]:
    params = component_params(a)
    return {c: int(n * BYTES_PER_PARAM[dtypes[c]]) for c, n in params.items()}


def safetensors_bytes(folder: str) -> int:
    """Bytes of a local checkpoint's safetensors files (0 when the folder is absent)."""
    path = Path(folder)
    return sum(f.stat().st_size for f in path.glob("*.safetensors")) if path.is_dir() else 0
