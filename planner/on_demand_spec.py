"""The profile's on-demand setting of a chat engine: it may sleep when idle and wake on a request.

Kept apart from profile.py so the schema gains one field per section; planner/on_demand_pool.py plans it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class OnDemandSpec(BaseModel):
    """A chat engine that is not always awake: the pool holds it awake only within the pool's awake set
    (`pools[].max_awake_on_demand`), and asleep it holds what its sleep leaves (docs/PLANNER.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    idle_sleep_s: float = Field(
        300.0,
        gt=0,
        description="The engine may be put to sleep once it has had no "
        "request in flight for this many seconds (the gateway may sleep it earlier, "
        "least recently used first, to make room for another engine's wake).",
    )
    wake_timeout_s: float = Field(
        180.0,
        gt=0,
        description="The longest a request waits for this engine to be "
        "awake: for room (idle engines put to sleep, busy ones finishing) and for a "
        "wake already under way. Past it the gateway answers 503 with Retry-After, "
        "naming the model. A wake once begun runs to its end (a CPU cold start of a "
        "135M model: see docs/PLANNER.md's measured seconds).",
    )
    tenant_wakes_per_hour: int = Field(
        30,
        ge=1,
        description="The most wakes of this engine one tenant's "
        "requests may cause in any hour (a wake is charged to the tenant whose "
        "request found it asleep); past it that request gets 429 naming the limit.",
    )
    level: Literal[1, 2] = Field(
        1,
        description="vLLM sleep level: 1 moves the weights to host memory and drops "
        "the KV cache (fast wake: a host-to-device copy); 2 drops both (the wake "
        "reloads the weights from disk). On a unified-memory GPU (GB10) level 1 frees "
        "nothing and the plan uses 2; on a CPU pool vLLM has no sleep mode and "
        "sleeping stops the engine (its processes exit, its wake is a cold start).",
    )
