"""Small request helpers the gateway's route mixins share."""

from __future__ import annotations

import asyncio
import contextvars

from fastapi import HTTPException
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
        await wait_out(task)
        raise


def page_limit(limit: int | None, settings) -> int:
    """A listing's page size: the request's `limit`, at most rag.documents_page_max (a 400 above it), or
    rag.documents_page_default when it gives none."""
    if limit is not None and limit > settings.documents_page_max:
        raise HTTPException(
            400, f"limit {limit} is above the largest page of {settings.documents_page_max} (rag.documents_page_max)"
        )
    return limit or settings.documents_page_default


async def wait_out(task: asyncio.Task) -> None:
    """Wait until `task` is done, through any number of cancellations of the waiter."""
    while not task.done():
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            continue


def release_heap_after_sending() -> BackgroundTask:
    """Bulk bodies (documents in, vectors out) leave megabytes in glibc's free lists; return them."""
    return BackgroundTask(release_freed_heap, collect=False)


def without_credentials(request: Request) -> Request:
    """The request as forwarded to the chat replica: the tenant's key stays at the gateway."""
    headers = [(k, v) for k, v in request.scope.get("headers", []) if k != b"authorization"]
    return Request({**request.scope, "headers": headers}, request.receive)
