"""SSE plumbing for the gateway: usage accounting and citations on top of vLLM's own chunks."""

from __future__ import annotations

import json

import anyio
from fastapi import Request
from vllm.entrypoints.generate.base.protocol import StreamOptions

from deployments.tenants import record_usage


async def sse_event_batches(body_iterator):
    """Complete SSE `data:` payloads, one list per piece that arrives.

    The chat replica sends a piece per stream-batching interval (several chunks when decoding
    outruns it); keeping that grouping through the gateway means one Ray Serve message per
    batch on the way to the proxy, not one per token.
    """
    buffer = ""
    async for piece in body_iterator:
        buffer += piece.decode() if isinstance(piece, bytes) else piece
        events = []
        while "\n\n" in buffer:
            event, buffer = buffer.split("\n\n", 1)
            if event.startswith("data: "):
                events.append(event[len("data: "):])
        if events:
            yield events
    if buffer.strip().startswith("data: "):
        yield [buffer.strip()[len("data: "):]]


def force_stream_usage(body) -> tuple[bool, bool]:
    """Streams always ask the engine for usage on every chunk, so tenant accounting is right even
    when the client hangs up early. Returns what the client asked for: (final usage, usage on
    every chunk), so the stream can give it exactly that."""
    if not getattr(body, "stream", False):
        return True, False
    options = body.stream_options
    wanted = (bool(options and options.include_usage), bool(options and options.continuous_usage_stats))
    body.stream_options = StreamOptions(include_usage=True, continuous_usage_stats=True)
    return wanted


async def tracked_stream(body_iterator, request: Request, model: str, cited: list[dict] | None,
                         client_wants_usage: bool, client_continuous_usage: bool = False):
    """Pass OpenAI chunks through; record usage when the stream ends (or the client leaves);
    chat-with-RAG's first chunk carries `citations`. Usage the client did not ask for is removed."""
    first, usage = True, None
    try:
        async for events in sse_event_batches(body_iterator):
            out = []
            for data in events:
                if data != "[DONE]":
                    chunk = json.loads(data)
                    usage = chunk.get("usage") or usage
                    if not chunk.get("choices"):
                        if not client_wants_usage:
                            continue  # the final usage-only chunk
                    elif not client_continuous_usage:
                        chunk.pop("usage", None)
                    if first and cited is not None:
                        chunk["citations"] = cited
                    first = False
                    data = json.dumps(chunk)
                out.append(f"data: {data}\n\n")
            if out:
                yield "".join(out)
    finally:
        # A client that hangs up cancels this task; anyio's cancellation would abort the write.
        with anyio.CancelScope(shield=True):
            await record_usage(request, model, usage)


async def rag_stream(body_iterator, cited: list[dict]):
    """/v1/rag/query stream: a citations event, answer deltas, a final usage event, [DONE]."""
    yield f"data: {json.dumps({'object': 'rag.citations', 'citations': cited})}\n\n"
    async for events in sse_event_batches(body_iterator):
        out = []
        for data in events:
            if data == "[DONE]":
                continue  # drain the source so its usage is recorded before this response ends
            chunk = json.loads(data)
            if chunk.get("object") == "error" or "error" in chunk:
                out.append(f"data: {json.dumps(chunk)}\n\n")
                continue
            for choice in chunk.get("choices", []):
                delta = (choice.get("delta") or {}).get("content")
                if delta:
                    out.append(f"data: {json.dumps({'object': 'rag.delta', 'delta': delta})}\n\n")
            if chunk.get("usage"):
                out.append(f"data: {json.dumps({'object': 'rag.usage', 'usage': chunk['usage']})}\n\n")
        if out:
            yield "".join(out)
    yield "data: [DONE]\n\n"
