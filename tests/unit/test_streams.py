"""SSE plumbing: event splitting, usage accounting hooks, citations, the RAG event stream."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from deployments.streams import rag_stream, sse_event_batches, tracked_stream


def _chunks(*events: dict | str) -> list[str]:
    return [f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events]


async def _aiter(items):
    for item in items:
        yield item


def _collect(agen) -> list:
    async def run():
        return [item async for item in agen]
    return asyncio.run(run())


def _events(out: list[str]) -> list[str]:
    """The SSE events of a stream, however they were grouped into pieces."""
    return [event + "\n\n" for event in "".join(out).split("\n\n") if event]


DELTA = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "Hi"}}]}
USAGE = {"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}}
REQUEST = SimpleNamespace(scope={})  # no tenant: usage recording is a no-op


def test_sse_events_reassembles_events_split_across_pieces():
    raw = "".join(_chunks(DELTA, "[DONE]"))
    pieces = [raw[:7], raw[7:30].encode(), raw[30:]]
    assert _collect(sse_event_batches(_aiter(pieces))) == [[json.dumps(DELTA), "[DONE]"]]


def test_a_batch_of_chunks_leaves_the_gateway_as_one_piece():
    batched = ["".join(_chunks(DELTA, DELTA)), "".join(_chunks(DELTA, USAGE, "[DONE]"))]
    out = _collect(tracked_stream(_aiter(batched), REQUEST, "m", None, True))
    assert len(out) == 2
    assert [e.strip() for e in _events(out)][-1] == "data: [DONE]" and len(_events(out)) == 5


def test_tracked_stream_drops_forced_usage_chunk_when_client_did_not_ask():
    out = _events(_collect(tracked_stream(_aiter(_chunks(DELTA, USAGE, "[DONE]")), REQUEST, "m", None, False)))
    assert [json.loads(e[6:]) if e.startswith("data: {") else e.strip() for e in out] == [DELTA, "data: [DONE]"]


def test_tracked_stream_keeps_usage_when_asked_and_puts_citations_first():
    cited = [{"document_id": "d", "chunk_id": "d#0", "score": 0.9, "text": "t"}]
    out = _events(_collect(tracked_stream(_aiter(_chunks(DELTA, USAGE, "[DONE]")), REQUEST, "m", cited, True)))
    first = json.loads(out[0][6:])
    assert first["citations"] == cited and first["choices"] == DELTA["choices"]
    assert json.loads(out[1][6:])["usage"] == USAGE["usage"]
    assert "citations" not in json.loads(out[1][6:])


def test_rag_stream_sequence():
    cited = [{"document_id": "d"}]
    out = _events(_collect(rag_stream(_aiter(_chunks(DELTA, USAGE, "[DONE]")), cited)))
    events = [e[6:].strip() for e in out]
    assert json.loads(events[0]) == {"object": "rag.citations", "citations": cited}
    assert json.loads(events[1]) == {"object": "rag.delta", "delta": "Hi"}
    assert json.loads(events[2]) == {"object": "rag.usage", "usage": USAGE["usage"]}
    assert events[3] == "[DONE]"
