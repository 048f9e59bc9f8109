"""The ingest route (gateway/routes/ingestion.py) without Ray: JSON and NDJSON answers, content types,
failures reported in the stream; the gateway stand-in of test_knowledge_routes."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from pydantic import ValidationError
from starlette.responses import StreamingResponse

from gateway.schemas import AddDocumentsRequest
from rag.store.knowledge_store import KnowledgeStore
from tests.fakes.rag import DIM
from tests.unit.gateway.routes.test_knowledge_routes import Gateway, request

LONG = "\n\n".join(f"Paragraph {i} about widgets." for i in range(7))


@pytest.fixture
def gateway(tmp_path):
    store = KnowledgeStore(tmp_path / "k.sqlite3", dim=DIM)
    yield Gateway(store)
    store.close()


def body(*documents, stream=False) -> AddDocumentsRequest:
    return AddDocumentsRequest.model_validate({"documents": list(documents), "stream": stream})


def streamed(response: StreamingResponse) -> list[dict]:
    async def read():
        return [
            json.loads(line)
            for part in [chunk async for chunk in response.body_iterator]
            for line in part.decode().splitlines()
        ]

    return asyncio.run(read())


def test_stream_reports_progress_then_the_same_answer_as_json(gateway):
    gateway._settings = gateway._settings.model_copy(update={"embed_batch_chunks": 3})
    response = asyncio.run(gateway.ingest_body("kb", body({"id": "a", "text": LONG}, stream=True), request()))
    assert response.media_type == "application/x-ndjson"
    events = streamed(response)
    progress = [e for e in events if e["event"] == "progress"]
    assert [(e["stage"], e["chunks_embedded"]) for e in progress] == [
        ("chunked", 0),
        ("embedding", 3),
        ("embedding", 6),
        ("embedding", 7),
        ("storing", 7),
        ("stored", 7),
    ]
    assert all(e["chunks"] == 7 and e["documents"] == 1 for e in progress)
    done = events[-1]
    assert done["event"] == "done" and done["chunks"] == 7 and done["documents"] == [{"id": "a", "chunks": 7}]
    assert done["tokens"] > 0
    again = json.loads(asyncio.run(gateway.ingest_body("kb", body({"id": "a", "text": LONG}), request())).body)
    assert again == {k: v for k, v in done.items() if k != "event"}


def test_a_failed_ingest_ends_the_stream_with_its_error(gateway):
    gateway._retriever.handle._target.store.capacity_chunks = 2
    events = streamed(asyncio.run(gateway.ingest_body("kb", body({"id": "a", "text": LONG}, stream=True), request())))
    assert events[-1]["event"] == "error" and events[-1]["status"] == 413
    assert "capacity" in events[-1]["error"]["message"].lower()
    assert [e["stage"] for e in events[:-1]] == ["chunked", "embedding", "storing"]  # and never "stored"


def test_html_and_markdown_uploads_are_stored_as_text(gateway):
    answer = json.loads(
        asyncio.run(
            gateway.ingest_body(
                "kb",
                body(
                    {
                        "id": "page",
                        "text": "<title>Pumps</title><p>The <b>pump</b> hums.</p>",
                        "content_type": "text/html",
                    },
                    {
                        "id": "notes",
                        "text": "# Valves\n\nThe *valve* [clicks](https://x).",
                        "content_type": "text/markdown",
                    },
                    {"id": "raw", "text": "<p>kept as typed</p>"},
                ),
                request(),
            )
        ).body
    )
    assert answer["chunks"] == 4
    store = gateway._retriever.handle._target.store
    assert [h.text for h in store.search_lexical("tenant-a", "kb", "pump", 5)] == ["The pump hums."]
    assert [h.text for h in store.search_lexical("tenant-a", "kb", "valve", 5)][-1] == "The valve clicks."
    assert [h.text for h in store.search_lexical("tenant-a", "kb", "typed", 5)] == ["<p>kept as typed</p>"]


def test_an_unknown_content_type_is_a_validation_error_naming_the_supported_ones():
    with pytest.raises(ValidationError, match="text/plain, text/markdown, text/html"):
        body({"id": "a", "text": "x", "content_type": "application/msword"})
    assert body({"id": "a", "text": "x"}).documents[0].content_type == "text/plain"
    assert (
        body({"id": "a", "text": "x", "content_type": "Text/HTML; charset=utf-8"}).documents[0].content_type
        == "text/html"
    )


class SlowHandle:
    """A handle whose every call takes a while, as a real embedder's does."""

    def __init__(self, inner):
        self._inner = inner

    def __getattr__(self, name):
        method = getattr(self._inner, name)

        async def remote(*args, **kwargs):
            await asyncio.sleep(0.05)
            return await method.remote(*args, **kwargs)

        return SimpleNamespace(remote=remote)


def test_a_client_that_leaves_mid_stream_still_gets_the_whole_ingest_stored(gateway):
    gateway._embedder = SlowHandle(gateway._embedder)
    gateway._settings = gateway._settings.model_copy(update={"embed_batch_chunks": 2})

    async def leave_after_first_event():
        response = await gateway.ingest_body("kb", body({"id": "a", "text": LONG}, stream=True), request())
        events = response.body_iterator
        first = json.loads(await events.__anext__())
        await events.aclose()  # what Starlette does when the client disconnects: waits for the ingest
        return first

    assert asyncio.run(leave_after_first_event())["stage"] == "chunked"
    info = gateway._retriever.handle._target.store.collection_info("tenant-a", "kb")
    assert info["chunk_count"] == info["indexed_vectors"] == 7
