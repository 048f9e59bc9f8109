"""Small request helpers the gateway's route mixins share."""

from __future__ import annotations

import asyncio
import contextvars

from starlette.background import BackgroundTask
from starlette.requests import Request

from system.process_memory import release_freed_heap


async def run_to_completion(coro):
    """Await `coro` in its own task. If this request is cancelled (the client hung up), wait for that
    task to finish before letting the cancellation through: the work it started is done, stored and
    charged, and the tenant's concurrency slot is held until then."""
    # A fresh context: Ray Serve cancels the replica calls a cancelled request made (it finds them
    # through the request's context), and this work must not be cancelled half-way.
    task = asyncio.get_running_loop().create_task(coro, context=contextvars.Context())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            try:
                await asyncio.wait([task])
            except asyncio.CancelledError:
                continue
        raise


def release_heap_after_sending() -> BackgroundTask:
    """Bulk bodies (documents in, vectors out) leave megabytes in glibc's free lists; return them."""
    return BackgroundTask(release_freed_heap, collect=False)


def without_credentials(request: Request) -> Request:
    """The request as forwarded to the chat replica: the tenant's key stays at the gateway."""
    headers = [(k, v) for k, v in request.scope.get("headers", []) if k != b"authorization"]
    return Request({**request.scope, "headers": headers}, request.receive)
