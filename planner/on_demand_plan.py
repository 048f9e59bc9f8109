"""What the plan says of one on-demand chat engine: its bytes awake and asleep, and how it sleeps and wakes.

Frozen, typed outputs of the plan (Plan.on_demand), read by the gateway (planner/awake_sets.py decides
which engines may be awake together); and the rule that turns an engine's planned lines into them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.gpu import RELEASED_AT_REST_PREFIXES

if TYPE_CHECKING:
    from planner.profile import ChatSpec, PoolSpec

# vLLM's sleep frees what its CuMemAllocator tagged "weights" and "kv_cache"; everything else (CUDA context,
# graphs, the activation cache, the engine's processes) is planned as still held by a sleeping engine.
FREED_BY_SLEEP = ("weights.", "kv_pool.", "recurrent_state", "drafter.weights", "drafter.kv", "drafter.recurrent_state")
# Level 1 keeps the weights in (pinned) host memory for a fast wake.
KEPT_ON_HOST_AT_LEVEL_1 = ("weights.", "drafter.weights")
# A CPU engine sleeps by stopping its processes; its Serve replica (the LLMServer driver) stays up, asleep or
# never woken: measured 547-714 MB with its resource tracker (docs/results/on-demand-cpu-2026-12-06.md).
KEPT_BY_A_STOPPED_CPU_ENGINE = ("runtime.driver", "runtime.traffic_growth")
# Of an asleep engine's lines, what its replica grows into under traffic, not there at rest: a CPU driver's
# traffic growth; on a GPU, vLLM's activation cache, which sleep empties (H200, 2026-12-06: a sleeping 4-layer
# cut held 0.95-1.19 GiB of the 3.74 GiB planned with it, docs/GPU.md).
GROWTH_LINES = ("runtime.traffic_growth", *RELEASED_AT_REST_PREFIXES)


class OnDemandEngine(BaseModel):
    """One on-demand engine's settings and bytes, as planned."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_id: str = Field(description="Name clients send as `model`.")
    idle_sleep_s: float = Field(description="May be put to sleep after this long without a request in flight.")
    wake_timeout_s: float = Field(
        description="The longest a request waits for it to be awake (OnDemandSpec.wake_timeout_s)."
    )
    tenant_wakes_per_hour: int = Field(
        description="The most wakes one tenant may cause in an hour (OnDemandSpec.tenant_wakes_per_hour)."
    )
    level_asked: Literal[1, 2] = Field(description="The sleep level the profile asked for.")
    sleep: Literal["level_1", "level_2", "stop"] = Field(
        description="How it sleeps, as planned: vLLM sleep "
        "level 1 or 2 (a unified-memory GPU: always 2), or stop "
        "(a CPU pool: no sleep mode, its processes exit)."
    )
    wake: Literal["copy_from_host", "reload_from_disk", "cold_start"] = Field(
        description="How it wakes: level 1 copies its weights back from host memory; level 2 reloads them from "
        "disk through the page cache; a stopped engine starts again (also every engine's first wake: on-demand "
        "engines start asleep)."
    )
    awake_bytes: int = Field(description="Its pool bytes awake: the replica's planned bytes.")
    asleep_bytes: int = Field(description="Its pool bytes asleep (0 when stopped: its processes exit).")
    asleep_breakdown: dict[str, int] = Field(description="The lines it holds in the pool asleep.")
    asleep_host_bytes: int = Field(
        0,
        description="Discrete GPU: its host memory asleep, beside the pool: its processes, and at level 1 its weights.",
    )
    asleep_host_breakdown: dict[str, int] = Field(default_factory=dict, description="Discrete GPU: those host lines.")
    wake_peak_bytes: int = Field(
        description="Its start lines while it wakes, on top of its awake bytes (the "
        "first wake is a start; on unified memory the checkpoint read through the page "
        "cache counts in the pool)."
    )
    wake_request_bytes: int = Field(
        description="What its start asks of free memory: a GPU's util x total + the "
        "start-up overhead vLLM samples after (runtime.CUDA_CONTEXT, or "
        "VLLM_GPU_START_OVERHEAD on unified memory); a CPU's kv_cache_memory_bytes."
    )
    wake_check_bytes: int = Field(
        description="Pool bytes that must be free beyond what the others hold for it "
        "to wake: the larger of awake + wake peak and vLLM's start request + its own "
        "start-up overhead (a GPU's util x total <= free check)."
    )

    @property
    def awake_extra_bytes(self) -> int:
        """What waking it adds to the pool over what it holds asleep."""
        return self.awake_bytes - self.asleep_bytes

    @property
    def asleep_at_rest_bytes(self) -> int:
        """What it holds asleep with no traffic: its asleep lines less those its replica grows into."""
        return self.asleep_bytes - sum(v for k, v in self.asleep_breakdown.items() if k.startswith(GROWTH_LINES))


class OnDemandPlan(BaseModel):
    """A pool's on-demand engines: the awake set the plan holds, and what the rest hold asleep."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_awake: int = Field(description="The most on-demand engines awake at once (pools[].max_awake_on_demand).")
    room_bytes: int = Field(
        description="Pool bytes the on-demand engines may hold together, asleep or awake: "
        "free to plan - Ray, page cache and every always-on replica."
    )
    engines: dict[str, OnDemandEngine] = Field(description="By replica name, in start order.")
    worst_awake_set: list[str] = Field(
        description="The awake set the plan holds: the max_awake engines that add the most bytes awake."
    )
    planned_bytes: int = Field(
        description="What the plan holds for them: every engine asleep + the worst awake set's extra bytes."
    )
    asleep_host_bytes_most: int = Field(
        0, description="Discrete GPU: the most host memory sleeping engines hold at once (all asleep)."
    )


def sleep_level(chat: "ChatSpec", pool: "PoolSpec") -> int:
    """The vLLM sleep level an on-demand engine on a GPU pool sleeps at: the profile's, but always 2 on unified
    memory, where host memory is the pool and level 1 frees nothing."""
    return 2 if pool.unified else chat.on_demand.level


def planned_engine(
    chat: "ChatSpec", pool: "PoolSpec", device: dict[str, int], host: dict[str, int], wake_peak: int, wake_request: int
) -> OnDemandEngine:
    """One engine's entry from its planned lines (device: the pool's; host: beside a discrete GPU)."""
    spec = chat.on_demand
    if not pool.gpu:
        sleep, wake, held_host = "stop", "cold_start", {}
        held = {k: v for k, v in device.items() if k.startswith(KEPT_BY_A_STOPPED_CPU_ENGINE)}
    else:
        level = sleep_level(chat, pool)
        held = {k: v for k, v in device.items() if not k.startswith(FREED_BY_SLEEP)}
        kept = {
            f"{k} (on host, level 1)": v
            for k, v in device.items()
            if level == 1 and k.startswith(KEPT_ON_HOST_AT_LEVEL_1)
        }
        held_host = {**host, **kept}
        sleep, wake = f"level_{level}", "copy_from_host" if level == 1 else "reload_from_disk"
    awake = sum(device.values())
    return OnDemandEngine(
        model_id=chat.model_id,
        idle_sleep_s=spec.idle_sleep_s,
        wake_timeout_s=spec.wake_timeout_s,
        tenant_wakes_per_hour=spec.tenant_wakes_per_hour,
        level_asked=spec.level,
        sleep=sleep,
        wake=wake,
        awake_bytes=awake,
        asleep_bytes=sum(held.values()),
        asleep_breakdown=held,
        asleep_host_bytes=sum(held_host.values()),
        asleep_host_breakdown=held_host,
        wake_peak_bytes=wake_peak,
        wake_request_bytes=wake_request,
        wake_check_bytes=max(awake + wake_peak, wake_request),
    )
