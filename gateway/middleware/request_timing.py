"""Where a generation request's time went inside the gateway, sent back as a `Server-Timing` header.

For a stream the header leaves with the first token, so its parts split the time to first token the client
saw: `admit` (key, pool guard, the tenant's limits), `prepare` (body checks, the prompt's tokens, the TPM
reservation, RAG retrieval), `wake` (an on-demand engine woken for it; 0 otherwise) and `engine` (the chat
replica's call until its first chunk, or its whole answer when not streamed). What the client saw beyond
their sum is HTTP and Ray Serve's proxy. bench/bench_gateway.py reads it against raw vLLM's time to first token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from starlette.requests import Request

TIMING_KEY = "poolserve.timing"  # per-request scope key, as tenant_guard's
PARTS = ("admit", "prepare", "wake", "engine")


@dataclass
class RequestTiming:
    """perf_counter() marks of one request, in the order they happen; a mark never reached stays None."""

    arrived: float = field(default_factory=time.perf_counter)
    admitted: float | None = None
    prepared: float | None = None
    engine_called: float | None = None
    engine_answered: float | None = None

    def mark(self, name: str) -> None:
        setattr(self, name, time.perf_counter())

    def parts_ms(self) -> dict[str, float]:
        """Each part whose two ends were marked, in milliseconds."""
        marks = (self.arrived, self.admitted, self.prepared, self.engine_called, self.engine_answered)
        return {
            name: (end - start) * 1000
            for name, start, end in zip(PARTS, marks, marks[1:])
            if start is not None and end is not None
        }

    def server_timing(self) -> str:
        return ", ".join(f"{name};dur={ms:.2f}" for name, ms in self.parts_ms().items())


def timing_of(request: Request) -> RequestTiming:
    """The request's timing, set by the auth middleware; a fresh one where none was (a unit test's app)."""
    return request.scope.setdefault(TIMING_KEY, RequestTiming())


def mark(request: Request, name: str) -> None:
    timing_of(request).mark(name)


def timing_headers(request: Request) -> dict[str, str]:
    """The Server-Timing header of what was marked, or nothing when nothing was."""
    value = timing_of(request).server_timing()
    return {"Server-Timing": value} if value else {}
