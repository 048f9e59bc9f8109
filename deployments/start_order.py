"""Ordered start: a replica waits in its constructor until the deployments before it are running.

Ray Serve starts every deployment of an application at once. On a GB10, engines that start together
each count the other's loading as their own overhead and fail vLLM's start check (vllm#55827, #35920),
so poolserve starts the engines one at a time, each after the previous one has allocated its KV cache
and answered its warm-up, and the other replicas after the engines. On a CPU, where vLLM checks nothing at
start, the engines start together (PoolSpec.engines_start). Each wait is logged and bounded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

logger = logging.getLogger("ray.serve")  # configured in every replica, so the order shows in the log


@dataclass(frozen=True)
class StartOrder:
    """What one replica waits for before it starts: (deployment, method) pairs, each for at most
    timeout_s (its plan's ServeSpec.start_wait_timeout_s)."""

    after: list[tuple[str, str]]
    timeout_s: float

    async def wait(self, me: str, app_name: str) -> None:
        await wait_for_predecessors(me, self.after, app_name, self.timeout_s)


async def wait_for_predecessors(me: str, predecessors: list[tuple[str, str]], app_name: str, timeout_s: float) -> None:
    """Block until each (deployment, method) answers; a call is routed only to a running replica,
    so an answer means that deployment finished its constructor (for an engine: KV cache allocated)."""
    from ray import serve

    if not predecessors:
        logger.info("start order: %s starts, nothing to wait for", me)
    for deployment, method in predecessors:
        started = time.monotonic()
        logger.info("start order: %s waits for %s", me, deployment)
        handle = serve.get_deployment_handle(deployment, app_name=app_name)
        await asyncio.wait_for(getattr(handle, method).remote(), timeout=timeout_s)
        logger.info("start order: %s starts, %s is running (waited %.1fs)", me, deployment, time.monotonic() - started)
