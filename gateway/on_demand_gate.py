"""The gateway's side of on-demand engines (issue 48): before a request goes to an on-demand engine it asks
the pool's wake coordinator (deployments/wake_coordinator.py, a handle the Ray binding hands in) to have the
engine awake, and tells it when the request has ended on every path, a stream's included (its end, an
error, the client leaving), so an engine with a request in flight is never put to sleep.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import HTTPException, Request
from starlette.responses import Response, StreamingResponse

from gateway.middleware.tenant_guard import tenant_of
from planner.plan import WAKE_COORDINATOR

logger = logging.getLogger("poolserve.gateway")


class OnDemandGate:  # the routes' default is OnDemandGate(None, set()): no engine on demand
    """`coordinator`: the wake coordinator's handle, or None when no engine is on demand (then every call
    passes straight through); `models`: the on-demand engines' model ids."""

    def __init__(self, coordinator, models: set[str]) -> None:
        self._coordinator = coordinator
        self._models = models
        self._endings: set[asyncio.Future] = set()  # request_ended calls sent from a stream's finally

    async def states(self) -> dict[str, str]:
        """Each on-demand model's state (awake, asleep, waking, sleeping); {} when none is on demand."""
        return await self._coordinator.states.remote() if self._coordinator is not None else {}

    async def metrics_text(self) -> bytes:
        return await self._coordinator.metrics_text.remote() if self._coordinator is not None else b""

    def measured(self) -> list[tuple[str, Awaitable[dict]]]:
        """The coordinator's memory reading, named as its plan line (none without on-demand engines)."""
        return [] if self._coordinator is None else [(WAKE_COORDINATOR, self._coordinator.memory.remote())]

    async def run(self, model: str, request: Request, call: Callable[[], Awaitable[Response]]) -> Response:
        """`call()`'s response, with `model` awake for it and counted in flight until it has ended (a stream:
        until its last chunk is sent or the client leaves). 503 + Retry-After when the engine could not be
        woken in time, 429 when the tenant's wakes of it are spent (a wake is charged to the request's tenant;
        "" with tenancy off)."""
        if self._coordinator is None or model not in self._models:
            return await call()
        tenant = tenant_of(request)
        asking = self._detached(lambda: self._coordinator.ensure_awake.remote(model, tenant.name if tenant else ""))
        try:
            # Shielded: a client that leaves mid-wake must not cancel the wake half-done in the coordinator, and
            # a "go" that comes after it left was counted in flight, so it is ended then.
            answer = await asyncio.shield(asking)
        except asyncio.CancelledError:
            asking.add_done_callback(lambda done: self._end_if_counted(done, model))
            raise
        if answer.outcome != "go":
            raise HTTPException(
                503 if answer.outcome == "busy" else 429,
                answer.message,
                headers={"Retry-After": str(answer.retry_after_s)},
            )
        try:
            response = await call()
        except BaseException:
            self._ended(model)
            raise
        if isinstance(response, StreamingResponse):
            response.body_iterator = self._ends_with(response.body_iterator, model)
        else:
            self._ended(model)
        return response

    async def _ends_with(self, chunks: AsyncIterator, model: str) -> AsyncIterator:
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            self._ended(model)

    @staticmethod
    def _detached(call: Callable[[], Awaitable]) -> asyncio.Future:
        """`call()` sent from a fresh context: Serve cancels every call made under a request it cancels (a
        client that leaves), and a lost request_ended pinned an engine awake for good (2026-12-06, CPU)."""
        return contextvars.Context().run(lambda: asyncio.ensure_future(call()))

    def _end_if_counted(self, asking: asyncio.Future, model: str) -> None:
        if not asking.cancelled() and asking.exception() is None and asking.result().outcome == "go":
            self._ended(model)

    def _ended(self, model: str) -> None:
        # Sent, not awaited: a finally that runs because the client left may itself be cancelled.
        ending = self._detached(lambda: self._coordinator.request_ended.remote(model))
        self._endings.add(ending)
        ending.add_done_callback(self._after_ending)

    def _after_ending(self, ending: asyncio.Future) -> None:
        self._endings.discard(ending)
        if not ending.cancelled() and ending.exception() is not None:
            logger.error("telling the wake coordinator a request ended failed: %s", ending.exception())
