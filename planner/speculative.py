"""Speculative decoding: vLLM's speculative_config, validation, and the drafter's bytes.

Every drafter byte comes out of the chat engine's budget (vLLM allocates draft KV in the same pool):
  ngram         nothing (prompt lookup), but hybrids still keep k extra state slots per sequence
  draft_model   the draft's weights + its layers' KV per token
  dspark/eagle  likewise (a DSpark drafter needs bf16 KV)
  mtp           the target's MTP head weights + its attention layer's KV per token
Hybrid (recurrent) targets keep (1 + k) state slots per sequence while speculating.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from planner.architecture import Architecture, ArchitectureError, find_config, architecture_from_config
from planner.profile import ChatSpec
from planner.weights import component_bytes, safetensors_bytes

DRAFTER_METHODS = ("draft_model", "dspark", "eagle", "eagle3")


class SpeculativeError(ValueError):
    """chat.speculative cannot run with this model."""


@dataclass(frozen=True)
class Drafter:
    method: str
    k: int
    weight_bytes: int
    kv_bytes_per_token: int
    state_blocks: int  # extra recurrent-state slots per sequence (k while speculating)
    vllm_config: dict | None
    architecture: Architecture | None = None


def _markov_head_params(cfg: dict, vocab_size: int) -> int:
    """A DSpark drafter's Markov head (vllm/model_executor/models/qwen3_dspark.py DSparkMarkovHead): two
    embeddings of markov_rank columns, one over the vocabulary and one over the draft vocabulary."""
    rank = int(cfg.get("markov_rank") or 0)
    return rank * (vocab_size + int(cfg.get("draft_vocab_size") or vocab_size))


def _draft_architecture(chat: ChatSpec) -> tuple[Architecture, str]:
    spec = chat.speculative
    if not spec.model:
        raise SpeculativeError(f"chat.speculative.method {spec.method} needs chat.speculative.model (a draft folder)")
    path = Path(spec.model)
    name = spec.architecture or path.name
    try:
        cfg, source = find_config(spec.model, spec.architecture)
    except ArchitectureError as exc:
        raise SpeculativeError(
            f"draft model folder {spec.model} is missing (no config.json) and no bundled "
            f"configs/models/{name}.json describes it: {exc}"
        ) from exc
    arch = architecture_from_config(cfg, name=name, source=source)
    markov = _markov_head_params(cfg, arch.vocab_size) if spec.method == "dspark" else 0
    if markov:
        arch = replace(arch, published={**arch.published, "markov_head_params": markov})
    return arch, source


def plan_drafter(
    chat: ChatSpec, target: Architecture, kv_dtype_bytes: int, kv_dtype_name: str, mtp_weight_bytes: int
) -> Drafter:
    spec = chat.speculative
    k = spec.num_speculative_tokens
    if spec.method == "none":
        return Drafter("none", 0, 0, 0, 0, None)
    if spec.method == "ngram":
        if spec.prompt_lookup_min > spec.prompt_lookup_max:
            raise SpeculativeError(
                f"chat.speculative: prompt_lookup_min {spec.prompt_lookup_min} > "
                f"prompt_lookup_max {spec.prompt_lookup_max}"
            )
        cfg = {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": spec.prompt_lookup_min,
            "prompt_lookup_max": spec.prompt_lookup_max,
        }
        return Drafter("ngram", k, 0, 0, k, cfg)
    if spec.method == "mtp":
        if not target.mtp_layers:
            raise SpeculativeError(
                f"chat.speculative.method mtp: {target.name} has no MTP head "
                "(mtp_num_hidden_layers is 0); use ngram or a draft model"
            )
        cfg = {"method": "mtp", "num_speculative_tokens": k}
        return Drafter("mtp", k, mtp_weight_bytes, target.mtp_kv_bytes_per_token(kv_dtype_bytes), k, cfg)
    draft, _ = _draft_architecture(chat)
    if spec.method in ("draft_model", "dspark") and draft.vocab_size != target.vocab_size:
        raise SpeculativeError(
            f"draft {draft.name} has vocabulary {draft.vocab_size:,} but the target "
            f"{target.name} has {target.vocab_size:,}; a draft must share the tokenizer"
        )
    if spec.method == "dspark" and kv_dtype_name not in ("auto", "bfloat16"):
        raise SpeculativeError(f"chat.speculative.method dspark needs bf16 KV; chat.kv_cache_dtype is {kv_dtype_name}")
    on_disk = safetensors_bytes(spec.model)
    if on_disk:
        weights = on_disk
    else:
        shares = draft.published.get("shares_target_embeddings", False)
        dtypes = {
            c: "bfloat16"
            for c in (
                "embed",
                "lm_head",
                "attention",
                "linear_attention",
                "mlp",
                "experts",
                "shared_experts",
                "router",
                "norms",
                "mtp",
                "ple",
                "vision",
            )
        }
        comps = component_bytes(draft, dtypes)
        comps["mtp"] = 0
        if shares:
            comps["embed"] = comps["lm_head"] = 0
        extra = int(draft.published.get("extra_params", 0)) + int(draft.published.get("markov_head_params", 0))
        weights = sum(comps.values()) + extra * 2
    cfg = {"method": spec.method, "model": spec.model, "num_speculative_tokens": k}
    return Drafter(spec.method, k, weights, draft.kv_bytes_per_token(kv_dtype_bytes), k, cfg, draft)
