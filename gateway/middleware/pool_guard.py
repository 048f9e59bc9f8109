"""The pool guard: sheds new work with 503 + Retry-After before the memory pool runs out.

On a GB10 a host whose unified memory runs out wedges (vllm#46307); in a cgroup pool the kernel's OOM
killer takes a replica. Neither may happen, so the gateway watches the pool and refuses new work first:
ingestion (large, deferrable) at the lower mark, every new generation or embedding at the higher one.
It recovers by itself once use drops below a mark minus a hysteresis band. Pure: no Ray.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Gauge

from system.cgroup import effective_limit_bytes, host_meminfo, limited_cgroup

GuardState = Literal["ok", "shedding_ingest", "shedding_all"]
STATE_CODES = {"ok": 0, "shedding_ingest": 1, "shedding_all": 2}


@dataclass(frozen=True)
class PoolReading:
    used_bytes: int  # what cannot be reclaimed: cgroup usage minus inactive file pages, or MemTotal - MemAvailable
    limit_bytes: int
    source: str  # "cgroup <path>" or "host (MemAvailable)"
    peak_bytes: int | None = None  # the cgroup's highest usage so far (its start peak included)

    @property
    def fraction(self) -> float:
        return self.used_bytes / self.limit_bytes if self.limit_bytes else 0.0


def _host_reading() -> PoolReading:
    info = host_meminfo()
    return PoolReading(info["MemTotal"] - info["MemAvailable"], info["MemTotal"], "host (MemAvailable)")


def read_pool() -> PoolReading:
    """The pool this process lives in: its limited memory cgroup if any, else the host's memory."""
    cgroup = limited_cgroup()
    if cgroup is not None and effective_limit_bytes(cgroup):
        return PoolReading(
            cgroup.in_use_bytes(), effective_limit_bytes(cgroup), f"cgroup {cgroup.path}", cgroup.peak_bytes()
        )
    return _host_reading()


def read_gpu_pool(index: int = 0) -> PoolReading:
    """A discrete GPU's memory as the pool (profile `unified: false`): NVML's used and total bytes of the
    device. NVML opens no CUDA context, so the gateway reads it without holding GPU memory itself."""
    import pynvml

    pynvml.nvmlInit()
    try:
        info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
        return PoolReading(int(info.total - info.free), int(info.total), f"gpu {index} (NVML)")
    finally:
        pynvml.nvmlShutdown()


class PoolGuard:
    def __init__(
        self,
        shed_ingest_at: float,
        shed_all_at: float,
        hysteresis: float = 0.03,
        sample_interval_s: float = 0.25,
        retry_after_s: int = 5,
        reader: Callable[[], PoolReading] = read_pool,
        clock: Callable[[], float] = time.monotonic,
        registry: CollectorRegistry | None = None,
        planned_bytes: int | None = None,
        basis: str = "",
    ):
        if not 0 < shed_ingest_at <= shed_all_at < 1:
            raise ValueError("the guard needs 0 < shed_ingest_at <= shed_all_at < 1")
        self.shed_ingest_at, self.shed_all_at, self.hysteresis = shed_ingest_at, shed_all_at, hysteresis
        self.retry_after_s = retry_after_s
        self.planned_bytes, self.basis = planned_bytes, basis  # what the plan holds in the pool, and why the marks
        self._reader, self._clock, self._interval = reader, clock, sample_interval_s
        self._lock = threading.Lock()
        self._state: GuardState = "ok"
        self._last: PoolReading | None = None
        self._read_at = float("-inf")
        self.shed_total = 0
        registry = registry or CollectorRegistry()
        self._used = Gauge("poolserve_pool_used_bytes", "Pool memory in use (not reclaimable)", registry=registry)
        self._limit = Gauge("poolserve_pool_limit_bytes", "Pool size", registry=registry)
        self._state_gauge = Gauge(
            "poolserve_pool_guard_state", "0 ok, 1 shedding ingest, 2 shedding all", registry=registry
        )

    def _next_state(self, fraction: float) -> GuardState:
        state = self._state
        if fraction >= self.shed_all_at:
            return "shedding_all"
        if state == "shedding_all" and fraction >= self.shed_all_at - self.hysteresis:
            return "shedding_all"
        if fraction >= self.shed_ingest_at:
            return "shedding_ingest"
        if state != "ok" and fraction >= self.shed_ingest_at - self.hysteresis:
            return "shedding_ingest"
        return "ok"

    def sample(self) -> tuple[GuardState, PoolReading]:
        with self._lock:
            now = self._clock()
            if self._last is None or now - self._read_at >= self._interval:
                self._last, self._read_at = self._reader(), now
                self._state = self._next_state(self._last.fraction)
                self._used.set(self._last.used_bytes)
                self._limit.set(self._last.limit_bytes)
                self._state_gauge.set(STATE_CODES[self._state])
            return self._state, self._last

    def refusal(self, kind: Literal["ingest", "work"], heaviest: Callable[[], bool] | None = None) -> str | None:
        """Why a new request of this kind is refused now, or None when it may run. Past shed_ingest_at,
        ingestion is refused, and so is other work of the tenant `heaviest()` says has the most requests
        in flight (asked only then); past shed_all_at, all new work."""
        state, reading = self.sample()
        if state == "ok":
            return None
        if state == "shedding_ingest" and kind == "work":
            if heaviest is None or not heaviest():
                return None
            what = "work from the tenant with the most requests in flight"
        else:
            what = "ingestion" if state == "shedding_ingest" else "work"
        self.shed_total += 1
        mark = self.shed_ingest_at if state == "shedding_ingest" or kind == "ingest" else self.shed_all_at
        return (
            f"the memory pool is {reading.fraction:.0%} in use ({reading.used_bytes / 2**30:.2f} of "
            f"{reading.limit_bytes / 2**30:.2f} GiB, {reading.source}); new {what} is refused until it is "
            f"below {mark - self.hysteresis:.0%}. Retry after {self.retry_after_s}s."
        )

    def describe(self) -> dict:
        state, reading = self.sample()
        return {
            "state": state,
            "used_bytes": reading.used_bytes,
            "limit_bytes": reading.limit_bytes,
            "fraction": round(reading.fraction, 4),
            "source": reading.source,
            "peak_bytes": reading.peak_bytes,
            "shed_ingest_at": self.shed_ingest_at,
            "shed_all_at": self.shed_all_at,
            "hysteresis": self.hysteresis,
            "shed_requests": self.shed_total,
            "plan_holds_bytes": self.planned_bytes,
            "marks_from": self.basis,
        }
