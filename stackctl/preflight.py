"""Preflight: compare the live pool with the plan before anything starts, and refuse with sized advice.

A plan says what the stack needs; the machine says what is free now. Other processes, or a cgroup
already half used, shrink what is free. On an integrated GPU (GB10) vLLM's start check reads
MemAvailable, as this check does: vLLM 0.32's MemorySnapshot.measure() takes psutil's
virtual_memory().available there (utils/mem_utils.py), so clean page cache (a fresh `poolserve fetch`)
does not fail it. vllm#48140 said MemFree; its reporter retracted that (the refusal's figure was
MemAvailable). Dropping clean page cache is hygiene on a unified GPU pool (stackctl/launcher.py), not a
condition of the check.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import psutil

from planner.plan import Plan
from planner.units import gib
from system.cgroup import MemoryCgroup, host_meminfo

DROP_CACHES = "/proc/sys/vm/drop_caches"


@dataclass(frozen=True)
class LiveMemory:
    total: int
    available: int  # MemAvailable: free + what the kernel can reclaim
    free: int  # MemFree: shown for the record; no check reads it (vLLM reads MemAvailable, vllm#48140)
    page_cache: int
    pool_limit: int | None = None  # the stack's cgroup pool, when it runs in one
    pool_usage: int = 0

    @property
    def usable(self) -> int:
        """What the stack can have: the host's available memory, capped by the room left in its pool."""
        if self.pool_limit is None:
            return self.available
        return min(self.available, self.pool_limit - self.pool_usage)


@dataclass
class PreflightResult:
    ok: bool
    lines: list[str] = field(default_factory=list)


def read_live(pool: MemoryCgroup | None = None) -> LiveMemory:
    info = host_meminfo()
    limit = pool.limit_bytes() if pool is not None else None
    return LiveMemory(
        info["MemTotal"],
        info["MemAvailable"],
        info["MemFree"],
        info.get("Cached", 0) + info.get("Buffers", 0),
        limit,
        pool.usage_bytes() if pool is not None else 0,
    )


def read_live_gpu(index: int = 0) -> LiveMemory:
    """A discrete GPU's memory as the live pool (profile `unified: false`): NVML's total and free. The device
    has no page cache, so available == free, which is what vLLM's start check reads there."""
    import pynvml

    pynvml.nvmlInit()
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
    finally:
        pynvml.nvmlShutdown()
    return LiveMemory(int(info.total), int(info.free), int(info.free), 0)


def host_fits(plan: Plan) -> tuple[bool, str]:
    """Beside a discrete GPU the host lines (runtimes, Ray, the index) need host memory of their own."""
    available = host_meminfo()["MemAvailable"]
    ok = plan.pool.host_bytes <= available
    return ok, (
        f"host: the plan's host lines need {gib(plan.pool.host_bytes)}, MemAvailable {gib(available)} -> "
        f"{'fits' if ok else 'does NOT fit'}"
    )


def biggest_other_processes(exclude: set[int], count: int = 5) -> list[tuple[str, int]]:
    """The processes outside the stack that hold the most memory (name, RSS)."""
    found = []
    for proc in psutil.process_iter(["pid", "name", "memory_info"]):
        if proc.info["pid"] in exclude or proc.info["memory_info"] is None:
            continue
        found.append((f"{proc.info['name']}[{proc.info['pid']}]", proc.info["memory_info"].rss))
    return sorted(found, key=lambda item: -item[1])[:count]


def shm_free_bytes() -> int | None:
    """Free space of /dev/shm, where Ray keeps its object store; None where there is none."""
    try:
        stats = os.statvfs("/dev/shm")
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def can_drop_page_cache() -> bool:
    return os.geteuid() == 0 and os.access(DROP_CACHES, os.W_OK)


def drop_clean_page_cache() -> None:
    os.sync()  # only clean pages are dropped: write dirty ones first
    with open(DROP_CACHES, "w") as handle:
        handle.write("1")


def needed_bytes(plan: Plan) -> int:
    return plan.pool.planned_bytes + plan.pool.ray_bytes + plan.pool.page_cache_bytes


def start_steps(plan: Plan) -> list[tuple[str, int, int]]:
    """(replica, bytes in use at its start peak, bytes in use once it has started), in start order: an
    engine's peak holds its checkpoint in the page cache (and compile workers) on top of its budget."""
    peaks = {a.name: a.start_peak_bytes for a in plan.admission}
    # issue 48: an on-demand engine beyond the plan's awake set starts asleep (deployments/chat.py): it holds
    # its asleep bytes (a CPU: its Serve replica, its engine not started) and no start peak until a request wakes it
    asleep = started_asleep(plan)
    running, steps = plan.pool.ray_bytes + plan.pool.page_cache_bytes, []
    for replica in sorted(plan.replicas, key=lambda r: r.start_order):
        running += asleep.get(replica.name, replica.pool_bytes)
        peak = 0 if replica.name in asleep else peaks.get(replica.name, 0)
        steps.append((replica.name, running + peak, running))
    return steps


def started_asleep(plan: Plan) -> dict[str, int]:
    """The on-demand engines beyond the plan's awake set, which start asleep (deployments/chat.py), and the
    bytes each holds so (a CPU: its Serve replica, its engine not started)."""
    demand = plan.on_demand
    if demand is None:
        return {}
    return {n: e.asleep_bytes for n, e in demand.engines.items() if n not in demand.worst_awake_set}


def check(plan: Plan, live: LiveMemory, others: list[tuple[str, int]] | None = None) -> PreflightResult:
    """Does the plan fit what is free now, at every start step? Pure: no side effects."""
    result = PreflightResult(ok=True)
    usable = live.usable
    where = f"pool {gib(live.pool_limit)} ({gib(live.pool_usage)} in use)" if live.pool_limit else "host"
    result.lines.append(
        f"live: MemTotal {gib(live.total)}, MemAvailable {gib(live.available)}, MemFree "
        f"{gib(live.free)}, page cache {gib(live.page_cache)}; {where}; usable {gib(usable)}"
    )
    for name, peak, started in start_steps(plan):
        fits = peak <= usable
        result.lines.append(
            f"  step {name}: {gib(peak)} at its start peak, {gib(started)} once started -> "
            f"{'fits' if fits else 'does NOT fit'}"
        )
        result.ok = result.ok and fits
    shm = shm_free_bytes()
    if shm is not None and shm < plan.ray.object_store_memory:
        result.lines.append(
            f"  /dev/shm has {gib(shm)} free but Ray's object store is planned at "
            f"{gib(plan.ray.object_store_memory)}: Ray would fall back to disk; enlarge /dev/shm "
            "or lower ray.object_store_memory"
        )
        result.ok = False
    # vLLM's GPU start check per engine, in start order: util x MemTotal must fit MemAvailable, sampled
    # after the engines before it took their share and after its own start-up footprint exists.
    # An engine that starts asleep is not started here: its check runs at its first wake, the others asleep.
    overhead = {a.name: a.overhead_bytes for a in plan.admission}
    asleep, taken = started_asleep(plan), 0
    for replica in sorted(plan.replicas, key=lambda r: r.start_order):
        if replica.name in asleep:
            taken += asleep[replica.name]
            continue
        if replica.kind == "chat" and plan.pool.gpu:
            requested = int((replica.vllm.gpu_memory_utilization or 0) * live.total)
            seen = live.usable - taken - overhead.get(replica.name, 0)
            if requested > seen:
                result.lines.append(
                    f"  {replica.name}: vLLM's start check would refuse util x MemTotal "
                    f"{gib(requested)}: MemAvailable at its turn, less its own start-up, is {gib(seen)}"
                )
                result.ok = False
        taken += replica.pool_bytes
    if not result.ok:
        short = needed_bytes(plan) - usable
        result.lines.append(
            f"refused: the plan needs {gib(needed_bytes(plan))}, {gib(usable)} is usable now "
            f"({gib(max(short, 0))} short). Free memory held by others, or plan for what is "
            f"free: `poolserve plan PROFILE --pool {max(usable, 0) // 2**20}MiB` shows what to shrink."
        )
        if others:
            result.lines.append("held by other processes: " + ", ".join(f"{name} {gib(rss)}" for name, rss in others))
    return result
