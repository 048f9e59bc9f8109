"""The gateway's knowledge routes only adapt HTTP to rag.pipeline: driven here without Ray, with
handles that call a real store and a fake embedder in-process, and a fake chat ingress."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from fastapi import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from deployments.knowledge import KnowledgeRoutes
from deployments.schemas import AddDocumentsRequest, RagQueryRequest
from planner.profile import RagSpec
from rag.retrieval import retrieve
from rag.store import KnowledgeStore
from tests.unit.rag_fakes import DIM, bag_of_words


class Handle:
    """A Ray handle stand-in: handle.method.remote(...) awaits the method called in-process."""

    def __init__(self, target):
        self._target = target

    def __getattr__(self, name):
        method = getattr(self._target, name)

        async def remote(*args, **kwargs):
            return method(*args, **kwargs)

        return SimpleNamespace(remote=remote)


class EmbedderReplica:
    def chunk(self, text):
        return [part for part in text.split("\n\n") if part.strip()]

    def embed(self, texts):
        import numpy as np

        return {"vectors": np.stack([bag_of_words(t) for t in texts]), "tokens": sum(len(t.split()) for t in texts)}

    def embed_query(self, text):
        return bag_of_words(text)


class RetrieverReplica:
    def __init__(self, store):
        self.store = store

    def upsert_documents(self, tenant, collection, documents):
        return self.store.upsert_documents(tenant, collection, documents)

    def search(self, tenant, collection, query):
        return retrieve(self.store, tenant, collection, query)


class ChatIngress:
    async def chat(self, body, request):
        self.prompts.append(body)
        return JSONResponse({"id": "c1", "model": body.model, "usage": {"prompt_tokens": 9, "completion_tokens": 2},
                             "choices": [{"message": {"role": "assistant", "content": "Mira Quell"}}]})


class Gateway(KnowledgeRoutes, ChatIngress):
    def __init__(self, store):
        self._embedder = Handle(EmbedderReplica())
        self._retriever = Handle(RetrieverReplica(store))
        self._settings = {**RagSpec(max_top_k=5).model_dump(), "unavailable_retry_after_s": 10}
        self._embed_model_id = "embedder"
        self.prompts, self.checked = [], []

    def _tenant(self, request):
        return "tenant-a"

    async def _require_model(self, request, model):
        return model or "chat-model"

    async def _check_prompt_fits(self, body, request):
        self.checked.append(body.model)

    async def _engine(self, call):
        return await call

    def _recheck_health(self):
        pass


def request() -> Request:
    return Request({"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b""})


@pytest.fixture
def gateway(tmp_path):
    store = KnowledgeStore(tmp_path / "k.sqlite3", dim=DIM)
    yield Gateway(store)
    store.close()


def ingest(gateway, docs):
    body = AddDocumentsRequest.model_validate({"documents": [{"id": i, "text": t} for i, t in docs]})
    return json.loads(asyncio.run(gateway.add_documents("facts", body, request())).body)


def test_ingest_then_query_answers_with_citations(gateway):
    assert ingest(gateway, [("zorblax", "The Zorblax reactor was invented by Dr. Mira Quell.\n\nIt makes 40 MW."),
                            ("cats", "Cats sleep a lot.")]) == {
        "collection": "facts", "chunks": 3, "documents": [{"id": "zorblax", "chunks": 2}, {"id": "cats", "chunks": 1}],
        "tokens": 26}  # the fake embedder's words, titles in front included
    body = RagQueryRequest(collection="facts", question="Who invented the Zorblax reactor?", top_k=2)
    response = asyncio.run(gateway.rag_query(body, request()))
    payload = json.loads(response.body)
    assert payload["answer"] == "Mira Quell" and payload["id"] == "c1" and payload["usage"]["completion_tokens"] == 2
    assert payload["citations"][0]["document_id"] == "zorblax"
    assert {"document_id", "chunk_id", "score", "text", "metadata"} <= set(payload["citations"][0])
    (prompt,) = gateway.prompts
    assert prompt.max_tokens == RagSpec().answer_max_tokens and prompt.temperature == 0.0
    assert "[1] The Zorblax reactor was invented" in prompt.messages[0]["content"]
    assert gateway.checked == ["chat-model"]  # the prompt went through the gateway's length/TPM check


@pytest.mark.parametrize("question, top_k, message", [("   ", 2, "no question"), ("cats?", 6, "above the limit")])
def test_invalid_queries_are_400(gateway, question, top_k, message):
    ingest(gateway, [("cats", "Cats sleep a lot.")])
    with pytest.raises(HTTPException) as raised:
        asyncio.run(gateway.rag_query(RagQueryRequest.model_construct(
            collection="facts", question=question, top_k=top_k, model=None, max_tokens=None, temperature=0.0,
            stream=False), request()))
    assert raised.value.status_code == 400 and message in raised.value.detail


def test_chat_with_rag_augments_the_messages(gateway):
    ingest(gateway, [("cats", "Cats sleep a lot."), ("bread", "Sourdough uses wild yeast.")])
    messages = [{"role": "user", "content": "What leavens sourdough?"}]
    augmented, hits = asyncio.run(gateway._augment_chat(request(), "facts", messages, 1))
    assert [h.document_id for h in hits] == ["bread"]
    assert augmented[0]["role"] == "system" and "Sourdough uses wild yeast." in augmented[0]["content"]
    assert augmented[1:] == messages
