"""Overcommit advice: name the biggest items and every concrete way to fit, each re-planned.

Every lever is a change to the profile; the planner is run again with it, and the refusal shows the
plan it gives (needed, headroom, or what still refuses). Levers that save nothing are dropped, and a
combination that fits (the biggest savers, added one by one) is offered when one exists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from pydantic import BaseModel

from planner.errors import Overcommit, PlanError
from planner.units import gib

if TYPE_CHECKING:
    from planner.engine import EnginePlan
    from planner.plan import Plan
    from planner.profile import PoolSpec, Profile

Change = dict[str, object]  # dotted profile path -> new value
Replan = Callable[["Profile", "int | None"], "Plan"]  # build_plan(profile, total, advise=False)


def apply(profile: "Profile", change: Change) -> "Profile":
    """A copy of the profile with dotted fields replaced; pins stay pins (model_copy keeps fields_set)."""
    for dotted, value in change.items():
        *parents, leaf = dotted.split(".")
        chain: list[BaseModel] = [profile]
        for key in parents:
            chain.append(getattr(chain[-1], key))
        new = chain[-1].model_copy(update={leaf: value})
        for parent, key in zip(reversed(chain[:-1]), reversed(parents)):
            new = parent.model_copy(update={key: new})
        profile = new
    return profile


def _levers(profile: "Profile", eng: "EnginePlan") -> list[tuple[str, Change]]:
    chat, facts = profile.chat, eng.facts
    levers: list[tuple[str, Change]] = []
    if eng.component_bytes.get("ple") and "ple" not in eng.disk_components:
        levers.append(("PLE on disk (chat.placement.ple: disk)", {"chat.placement": {**chat.placement, "ple": "disk"}}))
        for dtype in ("int4", "int3"):
            levers.append(
                (
                    f"PLE in {dtype} (chat.component_dtypes.ple: {dtype})",
                    {"chat.component_dtypes": {**chat.component_dtypes, "ple": dtype}},
                )
            )
    if chat.kv_cache_dtype in ("auto", "bfloat16") and facts["speculative_method"] != "dspark":
        levers.append(("fp8 KV (chat.kv_cache_dtype: fp8)", {"chat.kv_cache_dtype": "fp8"}))
    if chat.kv_cache_bytes != "auto":
        levers.append(
            (
                f"chat.kv_cache_bytes {gib(chat.kv_cache_bytes)} -> {gib(chat.kv_cache_bytes // 2)}",
                {"chat.kv_cache_bytes": chat.kv_cache_bytes // 2},
            )
        )
    seqs = facts["max_num_seqs"]
    if seqs > 1:
        change: Change = {"chat.max_num_seqs": seqs // 2}
        if chat.expected_concurrency:
            change["chat.expected_concurrency"] = min(chat.expected_concurrency, seqs // 2)
        levers.append((f"max_num_seqs {seqs} -> {seqs // 2}", change))
    if chat.max_num_batched_tokens > 256:
        levers.append(
            (
                f"max_num_batched_tokens {chat.max_num_batched_tokens} -> {chat.max_num_batched_tokens // 2}",
                {"chat.max_num_batched_tokens": chat.max_num_batched_tokens // 2},
            )
        )
    if facts["speculative_method"] not in ("none", "ngram"):
        spec = chat.speculative.model_copy(update={"method": "ngram", "model": None, "architecture": None, "hub": None})
        levers.append((f"speculative {facts['speculative_method']} -> ngram", {"chat.speculative": spec}))
    cap = profile.retriever.capacity_chunks
    levers.append((f"retriever.capacity_chunks {cap:,} -> {cap // 2:,}", {"retriever.capacity_chunks": cap // 2}))
    if profile.ray.include_dashboard:
        levers.append(("ray.include_dashboard false", {"ray.include_dashboard": False}))
    return levers


def _move_levers(profile: "Profile", short_node: str, nodes: list[str]) -> list[tuple[str, Change]]:
    """Move the embedder or the retriever off the node that is short, to each other node."""
    levers: list[tuple[str, Change]] = []
    for section in ("embedder", "retriever"):
        if (getattr(profile, section).node or nodes[0]) == short_node:
            levers += [
                (f"{section} to node {other} ({section}.node: {other})", {f"{section}.node": other})
                for other in nodes
                if other != short_node
            ]
    return levers


def _replan(
    replan: Replan, profile: "Profile", total: int | None, change: Change, node: str | None = None
) -> tuple[int | None, str]:
    """(bytes needed, outcome) of the plan with the change applied; needed is None if it cannot be sized.
    node: a plan of several nodes, judged on that node's pool (total then overrides only the first)."""
    try:
        plan = replan(apply(profile, change), total)
    except Overcommit as exc:
        if node is not None:
            return exc.needed if f"node {node} " in str(exc) else None, f"still refused: {exc}"
        return exc.needed, f"needs {gib(exc.needed)}, still short by {gib(exc.needed - exc.free)}"
    except PlanError as exc:
        return None, f"refused: {str(exc).splitlines()[0]}"
    p = next(pool for pool in plan.pools if pool.name == node) if node is not None else plan.pool
    start = f", {gib(p.start_headroom_bytes)} while starting" if plan.start_peak else ""
    return (
        p.free_bytes - p.headroom_bytes,
        f"fits: needs {gib(p.free_bytes - p.headroom_bytes)}, headroom {gib(p.headroom_bytes)}{start}  [fits]",
    )


def overcommit_message(
    profile: "Profile",
    spec: "PoolSpec",
    total: int,
    free: int,
    replicas,
    ray_breakdown: dict,
    page_cache: dict,
    eng: "EnginePlan",
    replan: Replan,
    nodes: list[str] | None = None,
    override: int | None = None,
) -> str:
    """replan: build_plan without advice (an overcommit raises Overcommit); nodes: the pools of a plan of
    several nodes (spec is the one that is short); override: the first pool's size as given to build_plan."""
    needed = sum(r.pool_bytes for r in replicas) + sum(ray_breakdown.values()) + sum(page_cache.values())
    short = needed - free
    if nodes:
        return _node_message(
            replan, profile, spec, total, free, needed, replicas, ray_breakdown, page_cache, eng, nodes, override
        )
    items = [(f"{r.name}.{k}", v) for r in replicas for k, v in r.breakdown.items()]
    items += [(f"ray.{k}", v) for k, v in ray_breakdown.items()] + list(page_cache.items())
    biggest = sorted(items, key=lambda kv: -kv[1])[:6]
    lines = [
        f"plan refused: profile {profile.name} needs {gib(needed)} but pool {spec.name} has {gib(free)} "
        f"({gib(total)} total - {gib(spec.reserve)} reserve); short by {gib(short)}.",
        "Biggest items:",
        *(f"  {name:<48} {gib(v):>12}" for name, v in biggest),
        "Ways to fit, each re-planned alone (levers that save nothing are left out):",
    ]
    rows = []
    for text, change in _levers(profile, eng):
        after, outcome = _replan(replan, profile, total, change)
        if after is not None and after < needed:
            rows.append((needed - after, text, change, outcome))
    rows.sort(key=lambda row: -row[0])
    lines += [f"  - {text} frees {gib(saved)}: {outcome}" for saved, text, _, outcome in rows]
    combined: Change = {}
    names: list[str] = []
    for _, text, change, _ in rows:
        if set(change) & set(combined):
            continue  # e.g. PLE on disk and PLE in int4 change the same setting
        combined, names = {**combined, **change}, [*names, text]
        after, outcome = _replan(replan, profile, total, combined)
        if outcome.endswith("[fits]"):
            if len(names) > 1:
                lines.append(f"  - together: {' + '.join(names)}: {outcome}")
            break
    else:
        lines.append("  - no combination of these fits; move replicas to another node or use a bigger pool")
    lines.append(f"  - a bigger pool: --pool {gib(total + short)} or more")
    return "\n".join(lines)


def _node_message(
    replan, profile, spec, total, free, needed, replicas, ray_breakdown, page_cache, eng, nodes, override
) -> str:
    """A plan of several nodes: name the node that is short, its biggest items, and levers re-planned on it
    (moving a replica to another node first)."""
    short = needed - free
    items = [(f"{r.name}.{k}", v) for r in replicas for k, v in r.breakdown.items()]
    items += [(f"ray.{k}", v) for k, v in ray_breakdown.items()] + list(page_cache.items())
    lines = [
        f"plan refused: node {spec.name} is short by {gib(short)}: profile {profile.name} needs "
        f"{gib(needed)} there but pool {spec.name} has {gib(free)} ({gib(total)} total - "
        f"{gib(spec.reserve)} reserve).",
        f"Replicas on node {spec.name}: {', '.join(r.name for r in replicas)}.",
        "Biggest items:",
        *(f"  {name:<48} {gib(v):>12}" for name, v in sorted(items, key=lambda kv: -kv[1])[:6]),
        f"Ways to fit node {spec.name}, each re-planned alone:",
    ]
    rows = []
    for text, change in [*_move_levers(profile, spec.name, nodes), *_levers(profile, eng)]:
        after, outcome = _replan(replan, profile, override, change, spec.name)
        # kept: it fits, it saves on this node, or it moves the shortage to another node (said so)
        if (
            "[fits]" in outcome
            or (after is not None and after < needed)
            or (after is None and outcome.startswith("still refused"))
        ):
            rows.append((after, text, outcome))
    lines += [f"  - {text}: {outcome}" for _, text, outcome in rows]
    index = nodes.index(spec.name)
    size = f"--pool {gib(total + short)}" if index == 0 else f"pools[{index}].total {gib(total + short)}"
    lines.append(f"  - a bigger pool on node {spec.name}: {size} or more")
    return "\n".join(lines)
