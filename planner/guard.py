"""The pool guard's marks, from the plan: shed load when memory rises past what the plan holds.

A fixed fraction of the pool cannot tell a planned engine from a leak. On a GPU vLLM allocates its KV
cache at start, so the device is as full at rest as the plan says: an H100 running the 27B is at 0.92
of its memory before the first request, over a fixed 0.90 mark (docs/GPU.md). So each mark is the
plan's resident bytes plus a stated share of the headroom the plan leaves (pool - planned), and never
below the profile's fixed fraction, which keeps the CPU marks where a plan is small and memory grows
with use. The hysteresis band is narrowed so that a pool back at its planned size always reads `ok`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from planner.profile import PoolSpec


class GuardPlan(BaseModel):
    """Everything the gateway's pool guard runs with, finished here (gateway/middleware/pool_guard.py PoolGuard)."""

    model_config = {"frozen": True, "extra": "forbid"}

    shed_ingest_at: float = Field(description="Fraction of the pool in use above which new ingestion is shed.")
    shed_all_at: float = Field(
        description="Fraction above which every new generation, embedding and ingestion is shed."
    )
    hysteresis: float = Field(
        description="Shedding stops this fraction below the mark that started it; never "
        "so wide that the plan's own resident bytes keep it shedding."
    )
    sample_interval_s: float = Field(description="The pool is read at most this often.")
    retry_after_s: int = Field(description="Retry-After of a shed request.")
    heaviest_at_least: int = Field(
        description="Past shed_ingest_at, the heaviest tenant with at least this many requests in flight is shed too."
    )
    reader: Literal["pool", "gpu"] = Field(
        description="What is read: the process's pool (a cgroup or the host's "
        "MemAvailable) or a discrete GPU's memory through NVML."
    )
    limit_bytes: int = Field(description="The pool's size the fractions are of (the device's memory on a GPU).")
    planned_bytes: int = Field(description="What the plan itself holds in that pool once started.")
    basis: str = Field(description="How the marks were set, in words (shown by `poolserve plan` and /status).")


def mark(planned_fraction: float, headroom_share: float, floor: float) -> float:
    """planned + share x (1 - planned), never below the fixed floor; kept under 1."""
    return round(min(0.999, max(floor, planned_fraction + headroom_share * (1 - planned_fraction))), 4)


def guard_plan(spec: PoolSpec, total_bytes: int, planned_bytes: int, discrete: bool) -> GuardPlan:
    """The marks for one pool. `planned_bytes` is what the plan holds there at most: on a discrete GPU its
    device lines; elsewhere its replicas, Ray and the page cache it counts."""
    planned = planned_bytes / total_bytes if total_bytes else 0.0
    ingest = mark(planned, spec.shed_ingest_headroom_share, spec.shed_ingest_at)
    every = max(ingest, mark(planned, spec.shed_all_headroom_share, spec.shed_all_at))
    # Half the gap between the plan and the first mark at most: back at its planned size the pool is `ok`.
    hysteresis = round(max(0.001, min(spec.shed_hysteresis, (ingest - planned) / 2)), 4)
    raised = ingest > spec.shed_ingest_at or every > spec.shed_all_at
    basis = (
        f"the plan holds {planned:.1%} of the pool; marks at the plan plus "
        f"{spec.shed_ingest_headroom_share:.0%} / {spec.shed_all_headroom_share:.0%} of the headroom it leaves"
        if raised
        else f"the profile's fixed marks (the plan holds {planned:.1%} of the pool)"
    )
    return GuardPlan(
        shed_ingest_at=ingest,
        shed_all_at=every,
        hysteresis=hysteresis,
        sample_interval_s=spec.shed_sample_interval_s,
        retry_after_s=spec.shed_retry_after_s,
        heaviest_at_least=spec.shed_heaviest_at_least,
        reader="gpu" if discrete else "pool",
        limit_bytes=total_bytes,
        planned_bytes=planned_bytes,
        basis=basis,
    )


def unplanned_guard() -> GuardPlan:
    """The profile schema's fixed marks for a pool with no plan behind it (a gateway built alone in tests)."""
    return guard_plan(PoolSpec(name="local"), 0, 0, discrete=False)
