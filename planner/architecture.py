"""Architecture reader: a model's config.json (or bundled public facts) -> shapes, KV and state bytes.

Sources, in order: `<model folder>/config.json`; else `configs/models/<name>.json` (public
architecture facts with their sources in `_sources`). Multimodal configs keep the language model in
`text_config`; the vision tower in `vision_config`. Facts a config.json does not carry (a PLE
table's shape, a sparse-attention indexer's per-token key, published checkpoint sizes) live in a
`poolserve` block of the bundled file.

KV per token (one token, all layers of a kind):
  full attention (GQA)  2 x layers x kv_heads x head_dim x kv_bytes
  MLA                   layers x (kv_lora_rank + qk_rope_head_dim) x kv_bytes   (no factor 2)
  sliding window        same per token as full, but a sequence holds at most window-1+batched tokens
  indexer (QSA/DSA)     layers x index_head_dim x indexer_bytes (stays bf16 when KV is fp8)
Recurrent state per sequence (Gated DeltaNet / Mamba layers):
  conv  (kernel-1+k) x conv_dim x conv_dtype,  ssm  heads x k_dim x v_dim (or state) x ssm_dtype
  k = num_speculative_tokens: vLLM keeps k extra conv rows so a rejected draft can be rolled back
  (mamba_utils.py MambaStateShapeCalculator.gated_delta_net_state_shape / mamba2_state_shape, num_spec).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from planner.units import cdiv

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "configs" / "models"

DTYPE_BYTES = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "auto": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
}


class ArchitectureError(ValueError):
    """The model's architecture cannot be read."""


@dataclass(frozen=True)
class Architecture:
    """Shapes the planner needs, read once from a config; all counts are per model."""

    name: str
    model_type: str
    source: str
    hidden_size: int
    vocab_size: int
    num_layers: int
    tie_word_embeddings: bool
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    full_layers: int
    sliding_layers: int = 0
    sliding_window: int | None = None
    linear_layers: int = 0
    attn_output_gate: bool = False
    # MLA
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # linear attention (Gated DeltaNet) / Mamba2
    lin_kind: str = ""  # "gdn" | "mamba2" | ""
    lin_k_heads: int = 0
    lin_v_heads: int = 0
    lin_k_dim: int = 0
    lin_v_dim: int = 0
    conv_kernel: int = 4
    mamba_state: int = 0
    mamba_groups: int = 1
    ssm_dtype: str = "bfloat16"
    # MLPs
    intermediate_size: int = 0
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    moe_layers: int = 0
    # extras
    mtp_layers: int = 0
    ple_rows: int = 0
    ple_dim: int = 0
    indexer_head_dim: int = 0
    indexer_dtype: str = "bfloat16"
    vision_params: int = 0
    max_position_embeddings: int = 0
    config_dtype: str = "bfloat16"
    quantization: str = "none"
    published: dict = field(default_factory=dict)

    @property
    def is_hybrid(self) -> bool:
        return self.linear_layers > 0

    @property
    def uses_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def attention_layers(self) -> int:
        return self.full_layers + self.sliding_layers

    # ---- KV ------------------------------------------------------------------------------
    def kv_bytes_per_token_per_layer(self, kv_dtype_bytes: int) -> int:
        if self.uses_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * kv_dtype_bytes
        return 2 * self.num_kv_heads * self.head_dim * kv_dtype_bytes

    def kv_bytes_per_token(self, kv_dtype_bytes: int) -> int:
        """Full-attention layers of the main model (sliding layers are per-sequence, below)."""
        return self.full_layers * self.kv_bytes_per_token_per_layer(kv_dtype_bytes)

    def indexer_bytes_per_token(self) -> int:
        """Sparse-attention indexer keys, one per full-attention layer; not quantized with the KV."""
        if not self.indexer_head_dim:
            return 0
        return self.full_layers * self.indexer_head_dim * DTYPE_BYTES[self.indexer_dtype]

    def mtp_kv_bytes_per_token(self, kv_dtype_bytes: int) -> int:
        """An MTP head's own attention layer(s); charged as drafter KV."""
        return self.mtp_layers * self.kv_bytes_per_token_per_layer(kv_dtype_bytes)

    def sliding_tokens_per_sequence(self, max_num_batched_tokens: int, max_model_len: int) -> int:
        if not self.sliding_layers or not self.sliding_window:
            return 0
        return min(max_model_len, self.sliding_window - 1 + max_num_batched_tokens)

    def sliding_bytes_per_sequence(
        self, kv_dtype_bytes: int, max_num_batched_tokens: int, max_model_len: int, block_size: int
    ) -> int:
        tokens = self.sliding_tokens_per_sequence(max_num_batched_tokens, max_model_len)
        tokens = cdiv(tokens, block_size) * block_size if tokens else 0
        return tokens * self.sliding_layers * self.kv_bytes_per_token_per_layer(kv_dtype_bytes)

    # ---- recurrent state -----------------------------------------------------------------
    def state_bytes_per_layer(self, conv_dtype_bytes: int, ssm_dtype_bytes: int, num_spec: int = 0) -> int:
        if self.lin_kind == "gdn":
            conv_dim = 2 * self.lin_k_heads * self.lin_k_dim + self.lin_v_heads * self.lin_v_dim
            ssm = self.lin_v_heads * self.lin_k_dim * self.lin_v_dim
        elif self.lin_kind == "mamba2":
            inner = self.lin_v_heads * self.lin_v_dim
            conv_dim = inner + 2 * self.mamba_groups * self.mamba_state
            ssm = self.lin_v_heads * self.lin_v_dim * self.mamba_state
        else:
            return 0
        return (self.conv_kernel - 1 + num_spec) * conv_dim * conv_dtype_bytes + ssm * ssm_dtype_bytes

    def state_bytes_per_sequence(self, conv_dtype_bytes: int, ssm_dtype_bytes: int, num_spec: int = 0) -> int:
        """One sequence's recurrent state over all linear-attention layers (k speculative tokens)."""
        return self.linear_layers * self.state_bytes_per_layer(conv_dtype_bytes, ssm_dtype_bytes, num_spec)

    def hybrid_attention_block(
        self, kv_dtype_bytes: int, conv_dtype_bytes: int, ssm_dtype_bytes: int, alignment: int, num_spec: int = 0
    ) -> int:
        """vLLM's attention block for hybrids: the smallest multiple of `alignment` tokens whose
        per-layer attention page is >= one layer's state page (platforms/interface.py
        _align_hybrid_block_size); 0 when the model has no recurrent layers."""
        state = self.state_bytes_per_layer(conv_dtype_bytes, ssm_dtype_bytes, num_spec)
        if not state:
            return 0
        per_token = self.kv_bytes_per_token_per_layer(kv_dtype_bytes)
        return alignment * cdiv(state, alignment * per_token)


def _get(cfg: dict, *keys, default=None):
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def _layer_counts(cfg: dict, num_layers: int) -> tuple[int, int, int]:
    """(full attention, sliding attention, linear attention) layer counts."""
    types = cfg.get("layer_types")
    if types:
        full = sum(t in ("full_attention", "attention") for t in types)
        sliding = sum(t in ("sliding_attention", "sliding_window") for t in types)
        linear = sum(t in ("linear_attention", "mamba", "gdn") for t in types)
        return full, sliding, linear
    interval = cfg.get("full_attention_interval")
    if interval:
        full = num_layers // interval
        return full, 0, num_layers - full
    window = cfg.get("sliding_window")
    if window and cfg.get("use_sliding_window"):
        dense = cfg.get("max_window_layers", num_layers)
        return dense, num_layers - dense, 0
    return num_layers, 0, 0


def _vision_params(vcfg: dict | None, facts: dict) -> int:
    if facts.get("vision_params"):
        return int(facts["vision_params"])
    if not vcfg:
        return 0
    hidden = _get(vcfg, "hidden_size", "embed_dim", default=0)
    inter = _get(vcfg, "intermediate_size", default=4 * hidden)
    depth = _get(vcfg, "depth", "num_hidden_layers", default=0)
    out = _get(vcfg, "out_hidden_size", default=hidden)
    merge = _get(vcfg, "spatial_merge_size", default=2) ** 2
    per_block = 4 * hidden * hidden + 2 * hidden * inter + 13 * hidden
    patch = _get(vcfg, "in_channels", default=3) * _get(vcfg, "patch_size", default=14) ** 2 * 2 * hidden
    merger = (hidden * merge) ** 2 + hidden * merge * out
    return depth * per_block + patch + merger


def architecture_from_config(cfg: dict, name: str = "", source: str = "") -> Architecture:
    facts = cfg.get("poolserve", {})
    text = cfg.get("text_config") or cfg
    num_layers = _get(text, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _get(text, "hidden_size", "d_model", "n_embd")
    if not num_layers or not hidden:
        raise ArchitectureError(f"{source or name}: config has no num_hidden_layers / hidden_size")
    heads = _get(text, "num_attention_heads", "n_head", default=1)
    full, sliding, linear = _layer_counts(text, num_layers)
    num_experts = _get(text, "num_experts", "n_routed_experts", "num_local_experts", default=0)
    moe_layers = 0
    if num_experts:
        dense_first = _get(text, "first_k_dense_replace", default=0)
        step = _get(text, "decoder_sparse_step", default=1) or 1
        only_mlp = set(_get(text, "mlp_only_layers", default=[]) or [])
        moe_layers = sum(1 for i in range(dense_first, num_layers) if (i + 1) % step == 0 and i not in only_mlp)
    lin_kind = ""
    if linear:
        lin_kind = "mamba2" if _get(text, "mamba_d_state", "ssm_state_size", "state_size") else "gdn"
    quant = (cfg.get("quantization_config") or {}).get("quant_method", "none")
    return Architecture(
        name=name or cfg.get("_name_or_path", "") or text.get("model_type", "model"),
        model_type=cfg.get("model_type", text.get("model_type", "")),
        source=source,
        hidden_size=hidden,
        vocab_size=_get(text, "vocab_size", default=cfg.get("vocab_size", 0)),
        num_layers=num_layers,
        tie_word_embeddings=bool(_get(cfg, "tie_word_embeddings", default=text.get("tie_word_embeddings", False))),
        num_attention_heads=heads,
        num_kv_heads=_get(text, "num_key_value_heads", "n_head_kv", default=heads),
        head_dim=_get(text, "head_dim", default=hidden // heads),
        full_layers=full,
        sliding_layers=sliding,
        sliding_window=text.get("sliding_window") if sliding else None,
        linear_layers=linear,
        attn_output_gate=bool(_get(text, "attn_output_gate", default=lin_kind == "gdn")),
        kv_lora_rank=_get(text, "kv_lora_rank", default=0) or 0,
        qk_rope_head_dim=_get(text, "qk_rope_head_dim", default=0) or 0,
        q_lora_rank=_get(text, "q_lora_rank", default=0) or 0,
        qk_nope_head_dim=_get(text, "qk_nope_head_dim", default=0) or 0,
        v_head_dim=_get(text, "v_head_dim", default=0) or 0,
        lin_kind=lin_kind,
        lin_k_heads=_get(text, "linear_num_key_heads", "mamba_n_groups", default=0),
        lin_v_heads=_get(text, "linear_num_value_heads", "mamba_n_heads", default=0),
        lin_k_dim=_get(text, "linear_key_head_dim", default=0),
        lin_v_dim=_get(text, "linear_value_head_dim", "mamba_d_head", default=0),
        conv_kernel=_get(text, "linear_conv_kernel_dim", "mamba_d_conv", "conv_kernel", default=4),
        mamba_state=_get(text, "mamba_d_state", "ssm_state_size", "state_size", default=0),
        mamba_groups=_get(text, "mamba_n_groups", "n_groups", default=1),
        ssm_dtype=_get(text, "mamba_ssm_dtype", default=text.get("dtype", "bfloat16")),
        intermediate_size=_get(text, "intermediate_size", default=4 * hidden),
        num_experts=num_experts,
        experts_per_token=_get(text, "num_experts_per_tok", "moe_topk", default=0),
        moe_intermediate_size=_get(text, "moe_intermediate_size", default=0),
        shared_expert_intermediate_size=_get(text, "shared_expert_intermediate_size", default=0),
        moe_layers=moe_layers,
        mtp_layers=_get(text, "mtp_num_hidden_layers", "num_nextn_predict_layers", default=0),
        ple_rows=int(facts.get("ple_rows", 0)),
        ple_dim=int(facts.get("ple_dim", 0)),
        indexer_head_dim=_get(text, "index_head_dim", default=facts.get("indexer_head_dim", 0)),
        indexer_dtype=facts.get("indexer_dtype", "bfloat16"),
        vision_params=_vision_params(cfg.get("vision_config"), facts),
        max_position_embeddings=_get(text, "max_position_embeddings", default=0),
        config_dtype=_get(text, "dtype", "torch_dtype", default=cfg.get("torch_dtype", "bfloat16")) or "bfloat16",
        quantization=quant,
        published=facts.get("published", {}),
    )


def bundled_facts(model: str, architecture: str | None = None) -> Path | None:
    """configs/models/<name>.json for this model: the named architecture, else the folder's name."""
    for candidate in filter(None, (architecture, Path(model).name, model)):
        bundled = BUNDLED_DIR / f"{candidate}.json"
        if bundled.exists():
            return bundled
    return None


def find_config(model: str, architecture: str | None = None) -> tuple[dict, str]:
    """(config dict, where it came from). A folder's config.json wins over bundled facts; the bundled
    `poolserve` block (facts a config.json does not carry) is kept when the folder's config has none."""
    path = Path(model)
    bundled = bundled_facts(model, architecture)
    if (path / "config.json").exists():
        cfg, source = json.loads((path / "config.json").read_text()), str(path / "config.json")
        facts = json.loads(bundled.read_text()).get("poolserve") if bundled else None
        if facts and "poolserve" not in cfg:
            # a checkpoint fetched from a hub has no PLE shape or published sizes; without them the
            # planner would lose the PLE table it must place
            cfg, source = {**cfg, "poolserve": facts}, f"{source} + poolserve facts of {bundled}"
        return cfg, source
    if bundled:
        return json.loads(bundled.read_text()), str(bundled)
    names = sorted(p.stem for p in BUNDLED_DIR.glob("*.json"))
    raise ArchitectureError(
        f"no config.json in {model} and no configs/models/<name>.json for it "
        f"(bundled: {', '.join(names) or 'none'}); set chat.architecture to one of them"
    )


def read_architecture(model: str, architecture: str | None = None) -> Architecture:
    cfg, source = find_config(model, architecture)
    return architecture_from_config(cfg, name=architecture or Path(model).name, source=source)


def embedding_dimension(model_dir: str | Path) -> int:
    """Output size of a sentence-transformers folder: its last Dense layer, else its pooling size."""
    folder = Path(model_dir)
    modules_file = folder / "modules.json"
    size = None
    if modules_file.exists():
        for module in json.loads(modules_file.read_text()):
            config = folder / module.get("path", "") / "config.json"
            if not module.get("path") or not config.exists():
                continue
            data = json.loads(config.read_text())
            size = data.get("out_features") or data.get("word_embedding_dimension") or size
    if size is None and (folder / "config.json").exists():
        size = json.loads((folder / "config.json").read_text()).get("hidden_size")
    if not size:
        raise ArchitectureError(f"cannot tell the embedding size of {folder}")
    return int(size)
