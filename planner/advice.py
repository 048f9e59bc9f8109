"""Overcommit advice: name the biggest items and every concrete way to fit, each with its size."""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.units import gib
from planner.weights import BYTES_PER_PARAM, component_params

if TYPE_CHECKING:
    from planner.engine import EnginePlan
    from planner.profile import PoolSpec, Profile


def _levers(profile: "Profile", eng: "EnginePlan", replicas, ray_breakdown: dict) -> list[tuple[str, int]]:
    chat, facts, b = profile.chat, eng.facts, eng.breakdown
    levers: list[tuple[str, int]] = []
    ple = eng.component_bytes.get("ple", 0)
    if ple and "ple" not in eng.disk_components:
        levers.append((f"PLE on disk (chat.placement.ple: disk) frees {gib(ple - chat.disk_page_cache_bytes)} "
                       f"({gib(ple)} table, {gib(chat.disk_page_cache_bytes)} page-cache headroom kept)",
                       ple - chat.disk_page_cache_bytes))
        params = component_params(eng.arch)["ple"]
        for dtype in ("int4", "int3"):
            saved = ple - int(params * BYTES_PER_PARAM[dtype])
            if saved > 0:
                levers.append((f"PLE in {dtype} (chat.component_dtypes.ple: {dtype}) frees {gib(saved)}", saved))
    attention = b.get("kv_pool.attention", 0)
    if attention and chat.kv_cache_dtype in ("auto", "bfloat16") and facts["speculative_method"] != "dspark":
        levers.append((f"fp8 KV (chat.kv_cache_dtype: fp8) halves {gib(attention)} of attention KV, "
                       f"freeing {gib(attention // 2)}", attention // 2))
    kv_total = attention + b.get("kv_pool.indexer (bf16)", 0) + sum(v for k, v in b.items() if k.startswith("drafter.kv"))
    if kv_total and chat.kv_cache_bytes != "auto":
        levers.append((f"chat.kv_cache_bytes {gib(chat.kv_cache_bytes)} -> {gib(chat.kv_cache_bytes // 2)} "
                       f"frees {gib(chat.kv_cache_bytes // 2)}", chat.kv_cache_bytes // 2))
    seqs = facts["max_num_seqs"]
    if seqs > 1:
        half = seqs // 2
        state = sum(v for k, v in b.items() if "recurrent_state" in k or k == "kv_pool.sliding_window")
        kv_part = kv_total // 2 if chat.kv_cache_bytes == "auto" else 0
        saved = state - state * half // seqs + kv_part
        if saved:
            what = "GDN state" if state else "KV"
            levers.append((f"max_num_seqs {seqs} -> {half} frees {gib(saved)} of {what}", saved))
    act = b.get("activations", 0)
    if act > 2**28 and chat.max_num_batched_tokens > 256:
        levers.append((f"max_num_batched_tokens {chat.max_num_batched_tokens} -> {chat.max_num_batched_tokens // 2}"
                       f" frees about {gib(act // 2)} of activations", act // 2))
    drafter = sum(v for k, v in b.items() if k.startswith("drafter."))
    if drafter:
        levers.append((f"speculative {facts['speculative_method']} -> ngram frees {gib(drafter)} "
                       "(drafter weights, KV and state)", drafter))
    retriever = next(r for r in replicas if r.name == "retriever")
    index = sum(v for k, v in retriever.breakdown.items() if k.startswith("index"))
    cap = profile.retriever.capacity_chunks
    levers.append((f"retriever.capacity_chunks {cap:,} -> {cap // 2:,} frees {gib(index // 2)}", index // 2))
    if ray_breakdown.get("dashboard"):
        levers.append((f"ray.include_dashboard false frees {gib(ray_breakdown['dashboard'])}", ray_breakdown["dashboard"]))
    for r in replicas:
        if r.name in ("embedder", "gateway"):
            levers.append((f"drop the {r.name} replica from this node (place it elsewhere) frees {gib(r.pool_bytes)}",
                           r.pool_bytes))
    return sorted(levers, key=lambda x: -x[1])


def overcommit_message(profile: "Profile", spec: "PoolSpec", total: int, free: int, replicas,
                       ray_breakdown: dict, page_cache: dict, eng: "EnginePlan") -> str:
    needed = sum(r.pool_bytes for r in replicas) + sum(ray_breakdown.values()) + sum(page_cache.values())
    short = needed - free
    items = [(f"{r.name}.{k}", v) for r in replicas for k, v in r.breakdown.items()]
    items += [(f"ray.{k}", v) for k, v in ray_breakdown.items()] + list(page_cache.items())
    biggest = sorted(items, key=lambda kv: -kv[1])[:6]
    lines = [
        f"plan refused: profile {profile.name} needs {gib(needed)} but pool {spec.name} has {gib(free)} "
        f"({gib(total)} total - {gib(spec.reserve)} reserve); short by {gib(short)}.",
        "Biggest items:",
        *(f"  {name:<48} {gib(v):>12}" for name, v in biggest),
        "Ways to fit (each alone; '[fits]' = enough by itself):",
    ]
    for text, saved in _levers(profile, eng, replicas, ray_breakdown):
        lines.append(f"  - {text}{'  [fits]' if saved >= short else ''}")
    lines.append(f"  - a bigger pool: --pool {gib(total + short)} or more")
    return "\n".join(lines)
