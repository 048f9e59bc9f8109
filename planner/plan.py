"""Turn a profile and a pool into exact per-replica numbers (v0: dense models on one node).

Every replica gets planned bytes with a breakdown, Ray actor options and env; the chat
replica also gets its vLLM engine arguments. Nothing here imports ray, torch or vllm.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from planner.profile import Profile

GiB = 2**30
# Measured here (DESIGN.md §4): a vLLM CPU engine is driver + EngineCore + Worker processes.
VLLM_DRIVER_BYTES = int(0.9 * GiB)
VLLM_ENGINE_CORE_BYTES = int(0.8 * GiB)
VLLM_WORKER_RUNTIME_BYTES = int(0.1 * GiB)
PYTHON_REPLICA_RUNTIME_BYTES = int(0.45 * GiB)  # a Ray worker with fastapi/ray imported
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "auto": 2}


class PlanError(ValueError):
    """The profile does not fit its pool; the message says what to shrink."""


class ReplicaPlan(BaseModel):
    name: str
    kind: Literal["chat", "embedder", "retriever", "gateway"]
    planned_bytes: int
    breakdown: dict[str, int]
    vllm: dict = Field(default_factory=dict)
    ray_actor_options: dict
    env: dict[str, str] = Field(default_factory=dict)
    start_order: int


class PoolPlan(BaseModel):
    total_bytes: int
    reserve_bytes: int
    free_bytes: int
    cpus: float


class ChatFacts(BaseModel):
    kv_bytes_per_token: int
    state_bytes_per_sequence: int = 0
    kv_pool_tokens: int
    weight_bytes: int


class Plan(BaseModel):
    profile: str
    pool: PoolPlan
    replicas: list[ReplicaPlan]
    chat: ChatFacts

    def replica(self, name: str) -> ReplicaPlan:
        for replica in self.replicas:
            if replica.name == name:
                return replica
        raise KeyError(name)


def detect_total_bytes() -> int:
    """Unified memory: the pool is the machine's MemTotal."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise PlanError("cannot read MemTotal from /proc/meminfo; set pools[0].total")


def _model_config(model: str) -> dict:
    path = Path(model)
    if (path / "config.json").exists():
        return json.loads((path / "config.json").read_text())
    bundled = Path(__file__).resolve().parent.parent / "configs" / "models" / f"{path.name}.json"
    if bundled.exists():
        return json.loads(bundled.read_text())
    raise PlanError(f"no config.json in {model} and no configs/models/{path.name}.json")


def _weight_bytes(model: str) -> int:
    path = Path(model)
    files = list(path.glob("*.safetensors")) if path.is_dir() else []
    if files:
        return sum(f.stat().st_size for f in files)
    raise PlanError(f"no safetensors weights in {model}")


def kv_bytes_per_token(config: dict, dtype_bytes: int) -> int:
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_heads = config.get("num_key_value_heads", heads)
    return 2 * config["num_hidden_layers"] * kv_heads * head_dim * dtype_bytes


def build_plan(profile: Profile, pool_total_bytes: int | None = None) -> Plan:
    pool_spec = profile.pools[0]
    total = pool_total_bytes or (detect_total_bytes() if pool_spec.total == "auto" else pool_spec.total)
    cpus = float(os.cpu_count() or 1) if pool_spec.cpus == "auto" else float(pool_spec.cpus)
    chat = profile.chat
    config = _model_config(chat.model)
    dtype_bytes = DTYPE_BYTES[chat.dtype]
    per_token = kv_bytes_per_token(config, dtype_bytes)
    if chat.kv_cache_bytes == "auto":
        kv_pool = per_token * chat.max_num_seqs * chat.expected_tokens_per_seq
    else:
        kv_pool = chat.kv_cache_bytes
    kv_tokens = kv_pool // per_token
    max_num_seqs = max(1, min(chat.max_num_seqs, kv_tokens // chat.expected_tokens_per_seq))
    if kv_tokens < chat.max_model_len:
        raise PlanError(
            f"KV pool holds {kv_tokens} tokens, fewer than max_model_len {chat.max_model_len}: "
            f"raise chat.kv_cache_bytes to at least {per_token * chat.max_model_len} bytes or lower max_model_len"
        )
    weights = _weight_bytes(chat.model)
    activations = chat.max_num_batched_tokens * config["hidden_size"] * 4 * 8
    omp = chat.omp_threads or max(1, int(cpus) - 1)
    chat_breakdown = {
        "weights": weights,
        "kv_pool": kv_pool,
        "activations": activations,
        "driver_runtime": VLLM_DRIVER_BYTES,
        "engine_core_runtime": VLLM_ENGINE_CORE_BYTES,
        "worker_runtime": VLLM_WORKER_RUNTIME_BYTES,
    }
    engine_kwargs = {
        "dtype": chat.dtype,
        "max_model_len": chat.max_model_len,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": chat.max_num_batched_tokens,
        "kv_cache_memory_bytes": kv_pool,
        "enable_prefix_caching": chat.enable_prefix_caching,
        "enable_chunked_prefill": True,
    }
    emb_weights = _weight_bytes(profile.embedder.model)
    d = 384
    index_bytes = profile.retriever.capacity_chunks * d * 4
    replicas = [
        ReplicaPlan(
            name="chat", kind="chat", planned_bytes=sum(chat_breakdown.values()), breakdown=chat_breakdown,
            vllm=engine_kwargs, start_order=0,
            ray_actor_options={"num_cpus": chat.num_cpus},
            env={"OMP_NUM_THREADS": str(omp), "VLLM_CPU_OMP_THREADS_BIND": "auto"},
        ),
        ReplicaPlan(
            name="embedder", kind="embedder", start_order=1,
            breakdown={"weights": emb_weights, "runtime": PYTHON_REPLICA_RUNTIME_BYTES},
            planned_bytes=emb_weights + PYTHON_REPLICA_RUNTIME_BYTES,
            ray_actor_options={"num_cpus": profile.embedder.num_cpus},
            env={"OMP_NUM_THREADS": str(profile.embedder.torch_threads)},
        ),
        ReplicaPlan(
            name="retriever", kind="retriever", start_order=2,
            breakdown={"index": index_bytes, "runtime": PYTHON_REPLICA_RUNTIME_BYTES},
            planned_bytes=index_bytes + PYTHON_REPLICA_RUNTIME_BYTES,
            ray_actor_options={"num_cpus": profile.retriever.num_cpus},
            env={"OMP_NUM_THREADS": str(profile.retriever.faiss_threads)},
        ),
        ReplicaPlan(
            name="gateway", kind="gateway", start_order=3,
            breakdown={"runtime": PYTHON_REPLICA_RUNTIME_BYTES},
            planned_bytes=PYTHON_REPLICA_RUNTIME_BYTES,
            ray_actor_options={"num_cpus": profile.gateway.num_cpus},
            env={"OMP_NUM_THREADS": "1"},
        ),
    ]
    free = total - pool_spec.reserve
    needed = sum(r.planned_bytes for r in replicas)
    if needed > free:
        biggest = sorted(((k, v) for r in replicas for k, v in r.breakdown.items()), key=lambda kv: -kv[1])[:3]
        items = ", ".join(f"{k} {v / GiB:.2f} GiB" for k, v in biggest)
        raise PlanError(f"plan needs {needed / GiB:.2f} GiB but the pool has {free / GiB:.2f} GiB free; biggest: {items}")
    return Plan(
        profile=profile.name,
        pool=PoolPlan(total_bytes=total, reserve_bytes=pool_spec.reserve, free_bytes=free, cpus=cpus),
        replicas=replicas,
        chat=ChatFacts(kv_bytes_per_token=per_token, kv_pool_tokens=kv_tokens, weight_bytes=weights),
    )

