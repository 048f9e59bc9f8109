"""Plan a pool's on-demand chat engines (issue 48): what the pool holds for them, their wake checks, and
the refusal, with the awake set that would fit, when the profile's does not.

build_plan calls on_demand_pool per node; a pool without on-demand engines gets OnDemandPool() and its plan
is exactly as before. On-demand engines start asleep (not started until their first request), so the start
order's admission covers the always-on replicas and each on-demand engine gets a wake row instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from planner import runtime
from planner.awake_sets import held_bytes, shortfall, worst_awake_set
from planner.errors import PlanError
from planner.on_demand_plan import OnDemandPlan, planned_engine
from planner.units import gib

if TYPE_CHECKING:
    from planner.plan import ReplicaPlan
    from planner.profile import PoolSpec, Profile


class OnDemandPool(BaseModel):
    """One pool's on-demand result for build_plan: nothing when the pool has no on-demand engine."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    section: OnDemandPlan | None = Field(None, description="Plan.on_demand.")
    adjust_bytes: int = Field(
        0,
        description="Planned bytes minus the on-demand replicas' awake bytes (<= 0): "
        "added to the pool's sum of replicas.",
    )
    wake_rows: list[dict] = Field(default_factory=list, description="Admission fields of each engine's wake.")
    notes: list[str] = Field(default_factory=list)

    @property
    def engines(self) -> set[str]:
        return set(self.section.engines) if self.section else set()


def on_demand_pool(
    profile: "Profile",
    spec: "PoolSpec",
    total: int,
    replicas: list["ReplicaPlan"],
    starts: dict[str, dict[str, int]],
    outside: int,
    multi: bool,
) -> OnDemandPool:
    """outside: Ray's and the page cache's bytes in this pool; starts: each engine's start lines."""
    marked = {name: chat for name, chat in profile.chat_engines() if chat.on_demand}
    if not marked:
        return OnDemandPool()
    if multi:
        raise PlanError(f"on-demand engines ({', '.join(marked)}) are planned on a profile of one pool only")
    for name, chat in marked.items():
        if chat.pipeline_parallel_size * chat.tensor_parallel_size > 1:
            raise PlanError(f"{name}: an on-demand engine is planned on one rank only (no pipeline/tensor ranks)")
    count = len(marked) if spec.max_awake_on_demand is None else spec.max_awake_on_demand
    if not 1 <= count <= len(marked):
        raise PlanError(
            f"pools[0].max_awake_on_demand {count}: the pool has {len(marked)} on-demand engines "
            f"({', '.join(marked)}); set 1 to {len(marked)}"
        )
    by_name = {r.name: r for r in replicas}
    discrete = spec.gpu and not spec.unified
    engines = {}
    for name, chat in marked.items():
        r = by_name[name]
        device, host = (r.breakdown, r.host_breakdown) if discrete else (r.breakdown, {})
        engines[name] = planned_engine(
            chat, spec, device, host, sum(starts[name].values()), _wake_request(r, spec, total)
        )
    room = total - spec.reserve - outside - sum(r.pool_bytes for r in replicas if r.name not in marked)
    section = _section(engines, count, room, discrete)
    notes = [_note(name, section) for name in engines]
    short = shortfall(section)
    if short:
        raise PlanError(refusal(profile.name, spec.name, total, section, short))
    wake_rows = [_wake_row(name, by_name[name].start_order, section) for name in engines]
    adjust = section.planned_bytes - sum(e.awake_bytes for e in engines.values())
    return OnDemandPool(section=section, adjust_bytes=adjust, wake_rows=wake_rows, notes=notes)


def _section(engines: dict, count: int, room: int, discrete: bool) -> OnDemandPlan:
    draft = OnDemandPlan(max_awake=count, room_bytes=room, engines=engines, worst_awake_set=[], planned_bytes=0)
    worst = worst_awake_set(draft, count)
    return draft.model_copy(
        update={
            "worst_awake_set": worst,
            "planned_bytes": held_bytes(draft, worst),
            "asleep_host_bytes_most": sum(e.asleep_host_bytes for e in engines.values()) if discrete else 0,
        }
    )


def _wake_request(r: "ReplicaPlan", spec: "PoolSpec", total: int) -> int:
    """What the engine's start asks of free memory, with its own start-up overhead (plan._admission's rule)."""
    if not spec.gpu:
        return r.vllm.kv_cache_memory_bytes
    overhead = runtime.CUDA_CONTEXT if not spec.unified else runtime.VLLM_GPU_START_OVERHEAD
    return int(r.vllm.gpu_memory_utilization * total) + overhead


def _wake_row(name: str, order: int, section: OnDemandPlan) -> dict:
    """The engine's wake as an admission row: beside the always-on replicas, the others asleep and the worst
    set of max_awake - 1 others awake."""
    engine = section.engines[name]
    others = worst_awake_set(section, section.max_awake - 1, without=name)
    free_before = section.room_bytes - (held_bytes(section, others) - engine.asleep_bytes)
    return {
        "name": name,
        "start_order": order,
        "free_before_bytes": free_before,
        "free_worst_bytes": free_before,  # the gateway sleeps others first: no worse turn
        "requested_bytes": engine.wake_request_bytes,
        "start_peak_bytes": engine.wake_peak_bytes,
        "start_headroom_bytes": free_before - engine.awake_bytes - engine.wake_peak_bytes,
        "check": f"wake ({engine.wake}), {len(others)} other on-demand awake: awake + peak, request <= free",
    }


def _note(name: str, section: OnDemandPlan) -> str:
    e = section.engines[name]
    if e.sleep == "stop":
        return (
            f"{name}: on demand (idle {e.idle_sleep_s:g} s): a CPU pool has no vLLM sleep mode, so it sleeps by "
            f"stopping (its processes exit, it holds nothing) and wakes by a cold start; it starts asleep"
        )
    if e.level_asked == 1 and e.sleep == "level_2":
        return (
            f"{name}: on demand (idle {e.idle_sleep_s:g} s): level 1 asked, planned level 2: on unified memory "
            "host memory is the same pool, so level 1 frees nothing; the wake reloads the weights from disk "
            f"through the page cache, which counts in the pool ({gib(e.wake_peak_bytes)} wake peak), as at a "
            f"start; asleep it holds {gib(e.asleep_bytes)} (context, graphs, processes)"
        )
    where = "in the pool" if not e.asleep_host_bytes else f"on the device, {gib(e.asleep_host_bytes)} on the host"
    return (
        f"{name}: on demand (idle {e.idle_sleep_s:g} s), sleep {e.sleep}, wake {e.wake}: asleep it holds "
        f"{gib(e.asleep_bytes)} {where}; it starts asleep (the first wake is a start)"
    )


def refusal(profile: str, pool: str, total: int, section: OnDemandPlan, short: dict[str, int]) -> str:
    """The refusal text: what does not fit, each engine's bytes, and the largest awake set that would."""
    worst = worst_awake_set(section, section.max_awake)
    lines = [
        f"plan refused: profile {profile}: the on-demand engines' awake set does not fit pool {pool}: "
        f"at most {section.max_awake} awake at once (pools[0].max_awake_on_demand) "
        f"{'is' if section.max_awake == 1 else 'are'} {', '.join(worst)}; short by "
        + "; ".join(f"{gib(v)} ({k})" for k, v in short.items())
        + ".",
        f"Room for on-demand engines (free - Ray, page cache and always-on replicas): {gib(section.room_bytes)}.",
        "On-demand engines: awake / asleep / needed free to wake:",
        *(
            f"  {n:<40} {gib(e.awake_bytes):>11} / {gib(e.asleep_bytes):>11} / {gib(e.wake_check_bytes):>11}"
            for n, e in section.engines.items()
        ),
    ]
    fitting = next(
        (k for k in range(section.max_awake - 1, 0, -1) if not shortfall(section.model_copy(update={"max_awake": k}))),
        0,
    )
    if fitting:
        lines.append(
            f"At most {fitting} of these on-demand engines awake at once fit: set "
            f"pools[0].max_awake_on_demand: {fitting}."
        )
    else:
        single = shortfall(section.model_copy(update={"max_awake": 1}))
        alone = [n for n in section.engines if f"wake {n}" not in single]
        lines.append(
            "No on-demand engine set fits awake beside the always-on replicas; "
            + (
                f"only {', '.join(alone)} can wake alone: drop or shrink the others."
                if alone
                else "shrink the engines or the always-on replicas."
            )
        )
    lines.append(f"  - or a bigger pool: --pool {gib(total + max(short.values()))} or more")
    return "\n".join(lines)
