"""The gateway's knowledge routes only adapt HTTP to rag.retrieval.pipeline: driven here without Ray, with
handles that call a real store and a fake embedder in-process, and a fake chat ingress."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from fastapi import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse

from gateway.routes.knowledge import KnowledgeRoutes
from gateway.schemas import AddDocumentsRequest, RagOptions, RagQueryRequest
from planner.profile import RagSpec
from rag.retrieval.search import retrieve
from rag.store.knowledge_store import KnowledgeStore
from tests.fakes.settings import gateway_settings
from tests.fakes.tokenizer import WordTokenizer
from tests.fakes.handles import FakeHandle
from tests.fakes.rag import DIM, bag_of_words, paragraph_chunks


class EmbedderReplica:
    def __init__(self):
        self.turns_of = []  # the tenant each call's batches queue as (rag/retrieval/embed_turns.py)

    def chunk_documents(self, texts):
        return [paragraph_chunks(text) for text in texts]

    def embed(self, texts, tenant):
        import numpy as np

        self.turns_of.append(("documents", tenant))
        vectors = np.stack([bag_of_words(t) for t in texts])
        # as the replica reports: its whole call, and of it the clean-up after the passes
        return {"vectors": vectors, "tokens": sum(len(t.split()) for t in texts), "busy_s": 0.002, "cleanup_s": 0.001}

    def embed_query(self, text, tenant):
        self.turns_of.append(("question", tenant))
        return bag_of_words(text)


class RetrieverReplica:
    def __init__(self, store):
        self.store = store

    def upsert_documents(self, tenant, collection, documents):
        return self.store.upsert_documents(tenant, collection, documents)

    def search(self, tenant, collection, query):
        return retrieve(self.store, tenant, collection, query)

    def collection_info(self, tenant, collection):
        return self.store.collection_info(tenant, collection)

    def list_documents(self, tenant, collection, limit, after):
        return self.store.list_documents(tenant, collection, limit, after)


class ChatIngress:
    reply, finish_reason = "Mira Quell", None

    async def chat(self, body, request):
        self.prompts.append(body)
        return JSONResponse(
            {
                "id": "c1",
                "model": body.model,
                "usage": {"prompt_tokens": 9, "completion_tokens": 2},
                "choices": [
                    {"message": {"role": "assistant", "content": self.reply}, "finish_reason": self.finish_reason}
                ],
            }
        )


class Gateway(KnowledgeRoutes, ChatIngress):
    def __init__(self, store):
        self._embedder = FakeHandle(EmbedderReplica())
        self._retriever = FakeHandle(RetrieverReplica(store))
        self._settings = gateway_settings(max_top_k=5, min_score=0.25, max_choices=4)
        self._embed_model_id = "embedder"
        self._engines = {"chat-model": SimpleNamespace(tokenizer=WordTokenizer())}
        self.prompts, self.checked, self.length_checked = [], [], []

    def _tenant(self, request):
        return "tenant-a"

    async def _require_model(self, request, model):
        return model or "chat-model"

    async def _check_prompt_fits(self, body, request):
        self.checked.append(body.model)

    async def _check_prompt_length(self, body):
        self.length_checked.append(body)
        if sum(len(m["content"]) for m in body.messages) > 5000:
            raise HTTPException(400, "prompt is longer than the model's context")
        return 1

    async def _engine(self, call, model=None):
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


def ingest(gateway, docs, metadata=None):
    body = AddDocumentsRequest.model_validate(
        {"documents": [{"id": i, "text": t, "metadata": (metadata or {}).get(i, {})} for i, t in docs]}
    )
    return json.loads(asyncio.run(gateway.ingest_body("facts", body, request())).body)


def test_ingest_then_query_answers_with_citations(gateway):
    assert ingest(
        gateway,
        [
            ("zorblax", "The Zorblax reactor was invented by Dr. Mira Quell.\n\nIt makes 40 MW."),
            ("cats", "Cats sleep a lot."),
        ],
    ) == {
        "collection": "facts",
        "chunks": 3,
        "documents": [{"id": "zorblax", "chunks": 2}, {"id": "cats", "chunks": 1}],
        "tokens": 26,
        "extraction_cpu_seconds": 0.0,
    }  # plain text: nothing extracted; the fake embedder's words, titles in front included
    body = RagQueryRequest(collection="facts", question="Who invented the Zorblax reactor?", top_k=2)
    response = asyncio.run(gateway.rag_query(body, request()))
    payload = json.loads(response.body)
    assert payload["answer"] == "Mira Quell" and payload["id"] == "c1" and payload["usage"]["completion_tokens"] == 2
    assert payload["citations"][0]["document_id"] == "zorblax"
    assert {"document_id", "chunk_id", "score", "text", "metadata", "start", "end"} <= set(payload["citations"][0])
    assert payload["refused"] is False and payload["best_similarity"] > 0.3
    (prompt,) = gateway.prompts
    assert prompt.max_tokens == RagSpec().answer_max_tokens and prompt.temperature == 0.0
    assert "[1] The Zorblax reactor was invented" in prompt.messages[0]["content"]
    assert gateway.checked == ["chat-model"]  # the prompt went through the gateway's length/TPM check
    # The documents' and the question's batches wait in the embedder as this tenant's (one turn per tenant).
    assert gateway._embedder._target.turns_of == [("documents", "tenant-a"), ("question", "tenant-a")]


def test_an_ingest_says_where_its_time_went_in_a_server_timing_header(gateway):
    """Issue 45: the stack's ingest was 0.13 of raw sentence-transformers on an H100 while the same pipeline
    in one process was 0.49; each part's milliseconds come back so a run shows which hop costs it."""
    body = AddDocumentsRequest.model_validate({"documents": [{"id": "a", "text": "Cats sleep.\n\nDogs bark."}]})
    response = asyncio.run(gateway.ingest_body("facts", body, request()))
    parts = dict(part.split(";dur=") for part in response.headers["server-timing"].split(", "))
    assert set(parts) == {"extract", "chunk", "embed", "embedder_busy", "embedder_cleanup", "charge", "store"}
    assert all(float(ms) >= 0 for ms in parts.values()) and float(parts["embed"]) >= float(parts["charge"])
    # the embedder's own report, summed over its calls: its clean-up is a part of its busy time
    assert float(parts["embedder_busy"]) == 2.0 and float(parts["embedder_cleanup"]) == 1.0


@pytest.mark.parametrize(
    "finish_reason, trim, answer",
    [
        ("length", True, "Dr. Mira Quell invented it [1]."),
        ("stop", True, "Dr. Mira Quell invented it [1]. It makes"),
        ("length", False, "Dr. Mira Quell invented it [1]. It makes"),
    ],
)
def test_an_answer_at_the_token_cap_ends_at_its_last_sentence(gateway, finish_reason, trim, answer):
    ingest(gateway, [("zorblax", REACTOR)])
    gateway.reply, gateway.finish_reason = "Dr. Mira Quell invented it [1]. It makes", finish_reason
    gateway._settings = gateway._settings.model_copy(update={"trim_capped_answers": trim})
    body = RagQueryRequest(collection="facts", question="Who invented the Zorblax reactor?", top_k=1)
    payload = json.loads(asyncio.run(gateway.rag_query(body, request())).body)
    assert payload["answer"] == answer and payload["finish_reason"] == finish_reason
    assert payload["usage"]["completion_tokens"] == 2  # what was generated, trimmed or not


@pytest.mark.parametrize("question, top_k, message", [("   ", 2, "no question"), ("cats?", 6, "above the limit")])
def test_invalid_queries_are_400(gateway, question, top_k, message):
    ingest(gateway, [("cats", "Cats sleep a lot.")])
    with pytest.raises(HTTPException) as raised:
        asyncio.run(
            gateway.rag_query(
                RagQueryRequest.model_construct(
                    collection="facts",
                    question=question,
                    top_k=top_k,
                    model=None,
                    max_tokens=None,
                    temperature=0.0,
                    stream=False,
                ),
                request(),
            )
        )
    assert raised.value.status_code == 400 and message in raised.value.detail


def test_chat_with_rag_augments_the_messages(gateway):
    ingest(gateway, [("cats", "Cats sleep a lot."), ("bread", "Sourdough uses wild yeast.")])
    messages = [{"role": "user", "content": "What leavens sourdough?"}]
    augmented, grounding = asyncio.run(
        gateway._augment_chat(request(), RagOptions(collection="facts", top_k=1), messages)
    )
    assert [h.document_id for h in grounding.hits] == ["bread"]
    assert augmented[0]["role"] == "system" and "Sourdough uses wild yeast." in augmented[0]["content"]
    assert augmented[1:] == messages


def test_context_tokens_bound_the_passages_prompted_and_cited(gateway):
    ingest(
        gateway,
        [
            ("zorblax", "The Zorblax reactor was invented by Dr. Mira Quell.\n\nIt makes 40 MW."),
            ("cats", "Cats sleep a lot."),
        ],
    )
    # The passages are 9, 4 and 4 words (tokens here): 16 holds the first two, 9 the first alone.
    body = RagQueryRequest(collection="facts", question="Who invented the Zorblax reactor?", top_k=3, context_tokens=16)
    payload = json.loads(asyncio.run(gateway.rag_query(body, request())).body)
    assert len(payload["citations"]) == 2
    gateway.prompts.clear()
    body = RagQueryRequest(collection="facts", question="Who invented the Zorblax reactor?", top_k=3, context_tokens=9)
    payload = json.loads(asyncio.run(gateway.rag_query(body, request())).body)
    assert [c["text"] for c in payload["citations"]] == ["The Zorblax reactor was invented by Dr. Mira Quell."]
    assert (
        "\n\n[2] " not in gateway.prompts[0].messages[0]["content"]
        and "Cats" not in gateway.prompts[0].messages[0]["content"]
    )
    _, grounding = asyncio.run(
        gateway._augment_chat(
            request(),
            RagOptions(collection="facts", top_k=3, context_tokens=9),
            [{"role": "user", "content": "Zorblax?"}],
            "chat-model",
        )
    )
    assert len(grounding.hits) == 1


# ---- over HTTP: the routes as the gateway registers them, with its error mapping ------------------

REACTOR = "The Zorblax reactor was invented by Dr. Mira Quell.\n\nIt makes 40 MW."
POLICIES = {
    f"{source}-{year}": f"The {source} travel policy of {year} pays for trains."
    for source in ("hr", "it")
    for year in (2024, 2025)
}
UNRELATED = "swallows airspeed?"  # shares no word with the documents: best (hashed) similarity 0.21 < 0.25
POLICY_METADATA = {doc_id: {"source": doc_id.split("-")[0], "year": int(doc_id.split("-")[1])} for doc_id in POLICIES}


@pytest.fixture
def http(gateway):
    from fastapi import FastAPI
    from starlette.testclient import TestClient

    from gateway.http_errors import install_error_handlers
    from gateway.http_app import ENDPOINTS

    app = FastAPI()
    install_error_handlers(app, 10)
    for name, route in ENDPOINTS.items():  # in the gateway's order: search must come before get_collection
        if name in (
            "add_documents",
            "search_collection",
            "search_collection_post",
            "get_collection",
            "rag_query",
            "list_documents",
        ):
            route(app)(getattr(gateway, name))
    ingest(gateway, [("zorblax", REACTOR), *POLICIES.items()], {"zorblax": {"src": "lab"}, **POLICY_METADATA})
    with TestClient(app) as client:
        yield client


def test_search_returns_passages_with_offsets_and_metadata_without_generating(http, gateway):
    response = http.get(
        "/v1/collections/facts/search", params={"q": "How much power does the Zorblax make?", "top_k": 2}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["object"], body["collection"], body["retrieval"]) == ("list", "facts", "hybrid")
    assert body["best_similarity"] > 0.25 and len(body["data"]) == 2
    first = body["data"][0]
    assert set(first) == {"document_id", "chunk_id", "score", "text", "start", "end", "metadata"}
    by_chunk = {p["chunk_id"]: p for p in body["data"]}
    assert REACTOR[by_chunk["zorblax#1"]["start"] : by_chunk["zorblax#1"]["end"]] == "It makes 40 MW."
    assert by_chunk["zorblax#1"]["metadata"] == {"src": "lab"}
    assert gateway.prompts == []  # no generation


def test_search_filters_as_a_json_parameter_or_a_post_body(http):
    filters = {"source": "hr", "year": {"in": [2025, 2024]}}
    got = http.get(
        "/v1/collections/facts/search", params={"q": "travel policy trains", "top_k": 5, "filters": json.dumps(filters)}
    ).json()
    assert {p["document_id"] for p in got["data"]} == {"hr-2024", "hr-2025"}
    posted = http.post(
        "/v1/collections/facts/search", json={"q": "travel policy trains", "top_k": 5, "filters": {"year": 2025}}
    ).json()
    assert {p["document_id"] for p in posted["data"]} == {"hr-2025", "it-2025"}


@pytest.mark.parametrize(
    "params, status, words",
    [
        ({"q": "x", "filters": "{not json"}, 400, "filters is not valid JSON"),
        ({"q": "x", "filters": json.dumps({"year": {"gt": 2020}})}, 422, "filters.year: unknown operator 'gt'"),
        ({"q": "x", "filters": json.dumps({"year": [2024]})}, 422, "filters.year: a list is not a filter value"),
        ({"q": "x", "filters": json.dumps({f"k{i}": 1 for i in range(17)})}, 422, "at most 16"),
        ({"q": "x", "top_k": 6}, 400, "above the limit of 5"),
        ({"q": "   "}, 400, "no question"),
        ({}, 422, "q"),
    ],
)
def test_search_errors_name_the_problem(http, params, status, words):
    response = http.get("/v1/collections/facts/search", params=params)
    assert response.status_code == status and words in response.json()["error"]["message"], response.text


def test_search_of_an_unknown_or_path_like_collection(http):
    assert http.get("/v1/collections/nope/search", params={"q": "x"}).status_code == 404
    assert http.get("/v1/collections/..%2Fetc/search", params={"q": "x"}).status_code == 400
    assert http.get("/v1/collections/a/b/search", params={"q": "x"}).status_code == 400
    assert http.get("/v1/collections/facts").json()["document_count"] == 5  # still routed to get_collection


def test_rag_query_applies_filters_to_its_citations(http):
    body = http.post(
        "/v1/rag/query",
        json={"collection": "facts", "question": "travel policy trains", "top_k": 5, "filters": {"source": "it"}},
    ).json()
    assert {c["document_id"] for c in body["citations"]} == {"it-2024", "it-2025"}
    response = http.post("/v1/rag/query", json={"collection": "facts", "question": "q", "filters": {"s": {"in": []}}})
    assert (
        response.status_code == 422 and "filters.s.in must be a non-empty list" in response.json()["error"]["message"]
    )


def test_rag_query_below_the_threshold_answers_that_the_knowledge_base_does_not_say(http, gateway):
    from rag.retrieval.no_answer import NO_ANSWER

    body = http.post("/v1/rag/query", json={"collection": "facts", "question": UNRELATED}).json()
    assert body["answer"] == NO_ANSWER and body["citations"] == [] and body["refused"] is True
    assert 0 <= body["best_similarity"] < 0.25 and body["usage"]["total_tokens"] == 0
    assert gateway.prompts == [] and gateway.checked == []  # no generation, nothing reserved
    assert len(gateway.length_checked) == 1  # but a question too long for the model would still be a 400
    # The request's min_score overrides the profile's.
    body = http.post("/v1/rag/query", json={"collection": "facts", "min_score": -1, "question": UNRELATED}).json()
    assert body["refused"] is False and body["answer"] == "Mira Quell" and body["citations"]


def test_rag_query_stream_below_the_threshold(http):
    from rag.retrieval.no_answer import NO_ANSWER

    with http.stream("POST", "/v1/rag/query", json={"collection": "facts", "stream": True, "question": UNRELATED}) as r:
        events = [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert parsed[0]["object"] == "rag.citations" and parsed[0]["citations"] == [] and parsed[0]["refused"] is True
    assert "".join(e["delta"] for e in parsed if e["object"] == "rag.delta") == NO_ANSWER
    assert parsed[-1] == {
        "object": "rag.usage",
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


def test_an_over_long_question_is_still_400_when_nothing_is_found(http):
    response = http.post("/v1/rag/query", json={"collection": "facts", "question": "swallows airspeed " * 350})
    assert response.status_code == 400 and "context" in response.json()["error"]["message"]


@pytest.mark.parametrize("route", ["rag", "search_get", "search_post"])
def test_a_question_over_the_profiles_limit_is_a_413_naming_it(http, route):
    limit = RagSpec().max_question_chars
    question = "a" * (limit + 1)
    if route == "rag":
        response = http.post("/v1/rag/query", json={"collection": "facts", "question": question})
    elif route == "search_get":
        response = http.get("/v1/collections/facts/search", params={"q": question})
    else:
        response = http.post("/v1/collections/facts/search", json={"q": question})
    message = response.json()["error"]["message"]
    assert response.status_code == 413 and f"is {limit + 1} characters" in message, "no request could carry it"
    assert f"the limit is {limit} (rag.max_question_chars)" in message
    # One character less is served.
    assert http.post("/v1/collections/facts/search", json={"q": "a" * limit}).status_code == 200


class ChatGateway(Gateway):
    """The fake gateway with the real Gateway.chat (its refusal path never reaches the chat ingress)."""

    from deployments.gateway import Gateway as _Real

    chat = _Real.chat
    _finish = _Real._finish
    _check_choices = _Real._check_choices


@pytest.mark.parametrize("stream", [False, True])
def test_chat_with_rag_below_the_threshold_is_the_fixed_reply(tmp_path, stream):
    from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest

    from rag.retrieval.no_answer import NO_ANSWER

    store = KnowledgeStore(tmp_path / "k.sqlite3", dim=DIM)
    gateway = ChatGateway(store)
    ingest(gateway, [("zorblax", REACTOR)])
    body = ChatCompletionRequest(
        model="chat-model",
        stream=stream,
        n=2,
        messages=[{"role": "user", "content": UNRELATED}],
        rag={"collection": "facts"},
    )
    response = asyncio.run(gateway.chat(body, request()))
    if stream:

        async def read():
            return [piece async for piece in response.body_iterator]

        events = "".join(asyncio.run(read())).split("\n\n")
        chunks = [json.loads(e[len("data: ") :]) for e in events if e.startswith("data: {")]
        assert chunks[0]["citations"] == [] and chunks[0]["refused"] is True
        assert {c["choices"][0]["delta"].get("content") for c in chunks[:2]} == {NO_ANSWER}
        assert events[-2] == "data: [DONE]"
    else:
        payload = json.loads(response.body)
        assert [c["message"]["content"] for c in payload["choices"]] == [NO_ANSWER, NO_ANSWER]
        assert payload["citations"] == [] and payload["refused"] is True and payload["object"] == "chat.completion"
    assert gateway.prompts == [] and gateway.checked == []
    store.close()


def test_chat_rag_field_validates_filters_naming_the_key():
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as raised:
        RagOptions.model_validate({"collection": "facts", "filters": {"year": {"between": [1, 2]}}})
    assert raised.value.title == "rag" and "filters.year: unknown operator 'between'" in str(raised.value)
    with pytest.raises(ValidationError, match="min_score"):
        RagOptions.model_validate({"collection": "facts", "min_score": 2})


def test_openapi_describes_the_search_routes_and_the_filter_shape(http):
    spec = http.get("/openapi.json").json()  # the fuzz test (tests/integration/test_fuzz.py) generates from it
    search = spec["paths"]["/v1/collections/{collection}/search"]
    assert {"get", "post"} <= set(search)
    assert {p["name"] for p in search["get"]["parameters"]} == {"collection", "q", "top_k", "filters"}
    schemas = json.dumps(spec["components"]["schemas"])
    assert '"maxProperties": 16' in schemas and '"required": ["in"]' in schemas


def test_collection_info_is_counts_and_documents_are_listed_in_pages(http):
    info = http.get("/v1/collections/facts").json()
    assert info["document_count"] == 5 and "documents" not in info
    ids, after = [], None
    while True:
        page = http.get("/v1/collections/facts/documents", params={"limit": 2, **({"after": after} if after else {})})
        assert page.status_code == 200, page.text
        body = page.json()
        assert len(body["data"]) <= 2
        ids += [d["id"] for d in body["data"]]
        if not body["has_more"]:
            break
        after = body["last_id"]
    assert ids == sorted(ids) and len(ids) == 5 and "zorblax" in ids
    default = http.get("/v1/collections/facts/documents").json()
    assert len(default["data"]) == 5 and default["data"][-1]["metadata"] == {"src": "lab"}


@pytest.mark.parametrize(
    "params, status, words",
    [
        ({"limit": 101}, 400, "largest page of 100"),
        ({"limit": 0}, 422, "limit"),
        ({"after": "a\x00b"}, 400, "document id"),
    ],
)
def test_document_listing_errors_name_the_problem(http, params, status, words):
    response = http.get("/v1/collections/facts/documents", params=params)
    assert response.status_code == status and words in response.json()["error"]["message"], response.text
