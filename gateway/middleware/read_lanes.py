"""Reads take turns: a tenant's listings, collection info and searches run one at a time while another
tenant has work in flight in this gateway replica.

Measured (docs/SECURITY.md, heavy reads): four clients of one tenant reading in a loop made another
tenant's chat p95 3x its quiet figure, one client 1.6-2.1x. Every read is bounded already; what hurt was
several of them running at once on the cores the other tenant's requests need. So a tenant's reads wait
in line for its previous read (waiting costs no CPU) whenever someone else is working, and only a tenant
alone on the replica reads several at once. One client reading alone was gentler than four taking turns
(its own round trips left gaps), so while others work a read also keeps the turn for a while after its
response has gone, in proportion to how long it took (gateway.reads_pause_ratio). A read never waits for another tenant's work, only for its
own tenant's earlier reads, so nobody is starved; the line is bounded in length and in time (then 429).
Per gateway replica, like the per-client limits.
"""

from __future__ import annotations

import asyncio
import re
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

# GET /v1/collections, /v1/collections/{c}, /v1/collections/{c}/documents, /v1/collections/{c}/search,
# and POST /v1/collections/{c}/search (a search with a JSON body).
_COLLECTION_READ = re.compile(r"^/v1/collections(/[^/]+(/documents|/search)?)?$")
_SEARCH = re.compile(r"^/v1/collections/[^/]+/search$")
# Longest a read keeps its tenant's turn after its response has gone (while others work).
PAUSE_MAX_S = 1.0


def is_read(method: str, path: str) -> bool:
    """A request that only reads a tenant's knowledge bases (listings, counts, passages)."""
    if method == "GET":
        return bool(_COLLECTION_READ.match(path))
    return method == "POST" and bool(_SEARCH.match(path))


class ReadsQueued(Exception):
    """The tenant's line of reads is full, or a read waited too long in it (a 429)."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass
class ReadLanes:
    alone: int  # reads of one tenant at once while no other tenant has work in flight
    queue_max: int  # reads of one tenant waiting at once; more get 429
    wait_s: float  # longest wait in line; then 429
    pause_ratio: float = 0.0  # while others work, a read keeps the turn this many times its own duration
    _working: dict[str, int] = field(default_factory=dict)  # requests in flight per tenant, reads included
    _reading: dict[str, int] = field(default_factory=dict)
    _waiting: dict[str, int] = field(default_factory=dict)
    _changed: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:  # made on the replica's event loop, at first use
            self._changed = asyncio.Condition()
        return self._changed

    def _others_working(self, tenant: str) -> bool:
        return any(count for name, count in self._working.items() if name != tenant)

    def _may_read(self, tenant: str) -> bool:
        reading = self._reading.get(tenant, 0)
        return reading == 0 or (reading < self.alone and not self._others_working(tenant))

    async def _notify(self) -> None:
        changed = self._condition()
        async with changed:
            changed.notify_all()

    @asynccontextmanager
    async def working(self, tenant: str):
        """Around every admitted request of `tenant`: others' reads take turns while it runs."""
        self._working[tenant] = self._working.get(tenant, 0) + 1
        try:
            yield
        finally:
            _decrement(self._working, tenant)
            await asyncio.shield(self._notify())

    @asynccontextmanager
    async def reading(self, tenant: str):
        """Around a read of `tenant`: waits for its turn, or raises ReadsQueued. While other tenants work,
        the turn is kept for `pause_ratio` times as long as the read took (at most PAUSE_MAX_S) after its
        response has gone: with 5, back-to-back reads use at most a sixth of one lane's time."""
        if not self._may_read(tenant):
            await self._wait_for_turn(tenant)
        self._reading[tenant] = self._reading.get(tenant, 0) + 1
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            yield
        finally:
            try:
                if self._others_working(tenant):
                    await asyncio.sleep(min(self.pause_ratio * (loop.time() - started), PAUSE_MAX_S))
            finally:
                _decrement(self._reading, tenant)
                await asyncio.shield(self._notify())

    async def _wait_for_turn(self, tenant: str) -> None:
        if self._waiting.get(tenant, 0) >= self.queue_max:
            raise ReadsQueued(
                f"{self.queue_max} reads of this tenant are already waiting for their turn "
                "(gateway.reads_queue_max); send fewer at once",
                retry_after_s=1,
            )
        self._waiting[tenant] = self._waiting.get(tenant, 0) + 1
        changed = self._condition()
        try:
            async with changed:
                await asyncio.wait_for(changed.wait_for(lambda: self._may_read(tenant)), self.wait_s)
        except TimeoutError:
            raise ReadsQueued(
                f"this read waited {self.wait_s:g} s for the tenant's earlier reads "
                "(gateway.reads_wait_s); send fewer at once",
                retry_after_s=int(self.wait_s),
            ) from None
        finally:
            _decrement(self._waiting, tenant)


def _decrement(counts: dict[str, int], tenant: str) -> None:
    counts[tenant] -= 1
    if not counts[tenant]:
        del counts[tenant]  # a tenant with nothing in flight leaves no entry behind
