"""Limits are limits (issue 46): a request whose own estimate is over its tenant's TPM is refused with a 429
naming the limit and the estimate and is charged nothing, and no minute is charged more than the TPM, with
requests of several sizes arriving at once: against the limiter itself (threads and processes), and through
the gateway's real middleware and routes (embeddings, chat, ingest, RAG) with fake replicas."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import re
import threading
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
from starlette.responses import JSONResponse

from gateway.http_app import ENDPOINTS, make_app
from gateway.middleware.tenant_guard import ADMIN_KEY_ENV, RESEED_ENV
from gateway.routes.knowledge import KnowledgeRoutes
from gateway.routes.openai_api import OpenAIRoutes
from rag.retrieval.pipeline import DocumentInput, RagPipeline
from rag.store.knowledge_store import KnowledgeStore
from tenancy import DEMO_KEY_ENV
from tenancy.limits import TenantLimiter, estimate_text_tokens
from tenancy.models import Tenant
from tests.fakes.handles import FakeHandle
from tests.fakes.rag import DIM, FakeEmbedder, RecordingIndex, bag_of_words, paragraph_chunks
from tests.fakes.settings import gateway_settings, unplanned_edge
from tests.fakes.tokenizer import WordTokenizer
from tests.unit.tenancy.tpm_child import reserve_in_turn

pytestmark = pytest.mark.timeout(120)
FROZEN = 6_000_000.0 + 1  # one second into a minute: the test's requests all share it
TPM = 20_000
TOO_LARGE = re.compile(
    r"Request too large for tenant '[^']+' on tokens per minute \(TPM\): "
    r"Limit (\d+), Requested (\d+)\."
)
OVER_MINUTE = re.compile(r"Limit (\d+), Used (\d+), Requested (\d+)")


# ---- the limiter alone: threads and processes, several sizes at once ------------------------------------

SIZES = [47_352, 25_000, 20_000, 15_000, 9_000, 7_500, 4_000, 2_500, 1_000, 300, 40, 1]


def _one_request(
    limiter: TenantLimiter,
    tenant: Tenant,
    estimate: int,
    used: int,
    start: threading.Barrier,
    outcomes: list,
    lock: threading.Lock,
) -> None:
    # All arrive at once: each is admitted on the headers (the middleware's 1 token, nothing held), then each
    # reserves its estimate once its body is read, all together.
    admission = limiter.admit(tenant, 1, reserve=False)
    decision, reservation = admission.decision, admission.reservation
    start.wait(timeout=30)
    if decision.allowed:
        more = limiter.reserve_more(tenant, reservation, estimate)
        decision, reservation = more.decision, more.reservation
    charged_while_running = limiter.tokens_charged(tenant)
    if decision.allowed:
        limiter.settle(tenant, reservation, used)
    with lock:
        outcomes.append((estimate, used, decision, charged_while_running))


@pytest.mark.parametrize("overrun", [0, 700], ids=["estimates-hold", "use-beyond-estimates"])
def test_parallel_requests_of_several_sizes_never_charge_a_minute_past_the_tpm(tmp_path, overrun):
    limiter = TenantLimiter(tmp_path / "limits.sqlite3", clock=lambda: FROZEN)
    tenant = Tenant(name="acme", tpm=TPM)
    requests = SIZES * 3
    # A request uses its estimate, or (second case) more than it: estimates are made before a request runs.
    used = {size: (size if size <= TPM else 0) + overrun for size in SIZES}
    start, lock, outcomes = threading.Barrier(len(requests)), threading.Lock(), []
    threads = [
        threading.Thread(target=_one_request, args=(limiter, tenant, size, used[size], start, outcomes, lock))
        for size in requests
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(outcomes) == len(requests)

    too_large = [(size, d) for size, _, d, _ in outcomes if d.reason == "request_too_large"]
    assert sorted(size for size, _ in too_large) == sorted(s for s in requests if s > TPM)
    assert all((d.limit, d.requested, d.retry_after_seconds) == (TPM, size, 0) for size, d in too_large)
    admitted = [(size, use) for size, use, d, _ in outcomes if d.allowed]
    refused = [d for _, _, d, _ in outcomes if d.reason == "tpm"]
    assert admitted and refused, "some fit the minute, some did not"
    assert max(size for size, _ in admitted) <= TPM
    assert sum(size for size, _ in admitted) <= TPM, "what ran was reserved within one minute's TPM"
    assert all(d.limit == TPM and d.retry_after_seconds >= 1 and d.used + d.requested > TPM for d in refused)
    assert all(charged <= TPM for _, _, _, (charged, _) in outcomes), "never over the TPM, even mid-flight"
    charged, carried = limiter.tokens_charged(tenant)
    assert charged <= TPM
    assert charged + carried == sum(use for _, use in admitted), "every used token is charged, none twice"
    if overrun and charged + carried > TPM:
        assert charged == TPM and carried > 0, "use beyond the minute is carried, not charged to it"


def test_two_gateway_processes_share_one_tpm_and_refuse_the_too_large_alike(tmp_path):
    db_path = tmp_path / "limits.sqlite3"
    TenantLimiter(db_path).close()  # the file, as the first replica makes it
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    halves = [SIZES[0::2] * 2, SIZES[1::2] * 2]
    workers = [
        ctx.Process(target=reserve_in_turn, args=(str(db_path), half, TPM, FROZEN, start, results)) for half in halves
    ]
    for worker in workers:
        worker.start()
    start.set()
    # bounded for a loaded 2-core host: each spawned child imports tpm_child.py, the limiter only
    answers = [results.get(timeout=180) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    admitted = [size for got, _ in answers for size in got]
    assert sorted(size for _, refused in answers for size in refused) == sorted(
        s for half in halves for s in half if s > TPM
    )
    assert 0 < sum(admitted) <= TPM
    charged, carried = TenantLimiter(db_path, clock=lambda: FROZEN).tokens_charged(Tenant(name="shared", tpm=TPM))
    assert (charged, carried) == (sum(admitted), 0)


# ---- through the gateway: the real middleware and routes, fake replicas ----------------------------------


class EmbedderReplica:
    """Holds every call until released, so the requests under test are all in flight at once; reads each
    text as characters / 4 + 2 tokens (at most 256), plus `extra` per call."""

    def __init__(self):
        self.released = asyncio.Event()
        self.waiting = 0
        self.calls: list[int] = []
        self.queries: list[str] = []
        self.extra = 0

    async def embed(self, texts, tenant):
        self.waiting += 1
        await asyncio.wait_for(self.released.wait(), timeout=30)
        self.calls.append(len(texts))
        tokens = estimate_text_tokens(texts, 256) + self.extra
        return {"vectors": np.stack([bag_of_words(t) for t in texts]), "tokens": tokens}

    def embed_query(self, text, tenant):
        self.queries.append(text)
        return bag_of_words(text)

    def chunk_documents(self, texts):
        return [paragraph_chunks(text) for text in texts]


class RetrieverReplica:
    def __init__(self, store: KnowledgeStore):
        self.store = store

    def upsert_documents(self, tenant, collection, documents):
        return self.store.upsert_documents(tenant, collection, documents)


class ChatIngress:
    """ray.serve.llm's ingress stand-in: answers max_tokens words, and keeps each body it was sent."""

    async def chat(self, body, request):
        self.sent.append(body)
        prompt = sum(len(str(m.get("content") or "").split()) for m in body.messages)
        answer = body.max_tokens or 8
        return JSONResponse(
            {
                "id": "c1",
                "model": body.model,
                "object": "chat.completion",
                "usage": {"prompt_tokens": prompt, "completion_tokens": answer, "total_tokens": prompt + answer},
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "length",
                        "message": {"role": "assistant", "content": "word " * answer},
                    }
                ],
            }
        )


class Gateway(OpenAIRoutes, KnowledgeRoutes, ChatIngress):
    def __init__(self, store: KnowledgeStore):
        self.embedder = EmbedderReplica()
        self._embedder = FakeHandle(self.embedder)
        self._retriever = FakeHandle(RetrieverReplica(store))
        self._settings = gateway_settings(embed_max_seq_tokens=256, health_timeout_s=30)
        self._chat_model_id, self._embed_model_id = "chat-model", "embedder"
        self._model_cards = {"chat-model": None}
        self._engines = {"chat-model": SimpleNamespace(tokenizer=WordTokenizer(), replica="chat", max_model_len=4096)}
        self._healthy_until = 0.0
        self.sent = []


@pytest.fixture
def stack(tmp_path, monkeypatch):
    monkeypatch.setenv(ADMIN_KEY_ENV, "admin-" + "k" * 40)
    monkeypatch.delenv(DEMO_KEY_ENV, raising=False)
    monkeypatch.delenv(RESEED_ENV, raising=False)
    umask = os.umask(0o022)
    os.umask(umask)
    store = KnowledgeStore(tmp_path / "knowledge.sqlite3", dim=DIM)
    gateway = Gateway(store)
    app = make_app(unplanned_edge(tmp_path / "state", {"max_body_bytes": 32 * 2**20, "unavailable_retry_after_s": 10}))
    for name in ("embeddings", "chat", "add_documents", "rag_query"):
        ENDPOINTS[name](app)(getattr(gateway, name))
    app.middleware_stack = app.build_middleware_stack()
    middleware = app.middleware_stack.app  # ServerErrorMiddleware, then the tenant middleware (outermost of ours)
    middleware.guard.limiter._clock = lambda: FROZEN
    yield SimpleNamespace(app=app, gateway=gateway, guard=middleware.guard)
    os.umask(umask)
    middleware.guard.store.close()
    middleware.guard.limiter.close()
    store.close()


def _tenant(stack, tpm: int) -> tuple[Tenant, dict]:
    tenant, key = stack.guard.store.create_tenant("acme", tpm=tpm)
    return tenant, {"Authorization": f"Bearer {key}"}


async def _all_at_once(stack, bodies: list[dict], headers: dict, path: str = "/v1/embeddings") -> list:
    """Every request in flight together: the embedder holds its calls until each request is either waiting
    in it or answered, then lets them all go."""
    answered = 0
    transport = httpx.ASGITransport(app=stack.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=60) as client:

        async def send(body):
            nonlocal answered
            try:
                return await client.post(path, json=body, headers=headers)
            finally:
                answered += 1

        async def release():
            for _ in range(3000):  # at most 30 s
                if stack.gateway.embedder.waiting + answered >= len(bodies):
                    break
                await asyncio.sleep(0.01)
            stack.gateway.embedder.released.set()

        releasing = asyncio.ensure_future(release())
        responses = await asyncio.gather(*(send(body) for body in bodies))
        await releasing
    return list(responses)


def _inputs(count: int, chars: int) -> list[str]:
    return [(f"passage {i}: " + "x" * chars)[:chars] for i in range(count)]


@pytest.mark.parametrize("extra", [0, 900], ids=["estimates-hold", "embedder-reads-more"])
def test_parallel_embeddings_of_several_sizes_through_the_gateway(stack, extra):
    tenant, headers = _tenant(stack, TPM)
    stack.gateway.embedder.extra = extra
    bodies = [
        {"input": _inputs(200, 1000)},  # 200 x 252 = 50,400 tokens: more than the whole minute
        {"input": _inputs(80, 1000)},
        {"input": _inputs(40, 1000)},
        {"input": _inputs(40, 1000)},
        {"input": _inputs(20, 400)},
        {"input": _inputs(8, 100)},
        {"input": "a short question"},
    ]
    estimates = [
        estimate_text_tokens(b["input"] if isinstance(b["input"], list) else [b["input"]], 256) for b in bodies
    ]
    assert estimates[0] == 50_400 and estimates[1] == 20_160 and all(e <= TPM for e in estimates[2:])
    responses = asyncio.run(_all_at_once(stack, bodies, headers))

    large = responses[0]
    assert large.status_code == 429 and large.json()["error"]["type"] == "rate_limit_error"
    assert TOO_LARGE.search(large.json()["error"]["message"]).groups() == (str(TPM), "50400"), large.text
    assert "Retry-After" not in large.headers and large.headers["x-should-retry"] == "false", "retrying cannot help"
    assert TOO_LARGE.search(responses[1].json()["error"]["message"]).groups() == (str(TPM), "20160")

    ok = [(e, r) for e, r in zip(estimates, responses) if r.status_code == 200]
    waited = [r for r in responses[2:] if r.status_code == 429]
    assert ok and sum(e for e, _ in ok) <= TPM, "what ran was reserved within the minute"
    for refused in waited:
        limit, used, requested = map(int, OVER_MINUTE.search(refused.json()["error"]["message"]).groups())
        assert limit == TPM and used + requested > TPM and int(refused.headers["Retry-After"]) >= 1
    used = sum(r.json()["usage"]["total_tokens"] for _, r in ok)
    assert len(stack.gateway.embedder.calls) == len(ok), "a refused request never reached the embedder"
    charged, carried = stack.guard.limiter.tokens_charged(tenant)
    assert charged <= TPM and charged + carried == used, (charged, carried, used)
    assert sum(row.prompt_tokens for row in stack.guard.store.usage("acme")) == used
    refusals = stack.guard.rejections.counts("acme")["acme"]
    assert refusals == {"request_too_large": 2, **({"tpm": len(waited)} if waited else {})}


def test_a_chat_over_the_tpm_is_too_large_and_one_without_max_tokens_is_fitted_to_it(stack):
    tenant, headers = _tenant(stack, 300)
    stack.gateway.embedder.released.set()
    chat = {
        "model": "chat-model",
        "messages": [{"role": "user", "content": "one two three four five six seven eight nine ten"}],
    }
    with _sync(stack) as client:
        refused = client.post("/v1/chat/completions", json={**chat, "max_tokens": 200, "n": 2}, headers=headers)
        assert refused.status_code == 429 and refused.headers["x-should-retry"] == "false"
        assert TOO_LARGE.search(refused.json()["error"]["message"]).groups() == ("300", "410"), refused.text
        assert "prompt + max_tokens x n" in refused.json()["error"]["message"]
        assert stack.guard.limiter.tokens_charged(tenant) == (0, 0) and not stack.gateway.sent, "nothing ran"

        # A prompt alone over the TPM is too large even without max_tokens.
        long = {"model": "chat-model", "messages": [{"role": "user", "content": "word " * 400}]}
        too_long = client.post("/v1/chat/completions", json=long, headers=headers)
        assert too_long.status_code == 429
        assert TOO_LARGE.search(too_long.json()["error"]["message"]).groups() == ("300", "401")
        # No max_tokens: the context (4096) would leave 4086, over the TPM; the answer gets what the TPM leaves.
        fitted = client.post("/v1/chat/completions", json=chat, headers=headers)
        assert fitted.status_code == 200, fitted.text
        assert stack.gateway.sent[-1].max_tokens == 290 and fitted.json()["usage"]["total_tokens"] == 300
        assert stack.guard.limiter.tokens_charged(tenant) == (300, 0)
        # The minute is spent: the next is an ordinary 429 to wait out, naming what it holds (refused on its
        # headers, before its body and estimate are read).
        waiting = client.post("/v1/chat/completions", json={**chat, "max_tokens": 5}, headers=headers)
        assert waiting.status_code == 429 and int(waiting.headers["Retry-After"]) >= 1
        assert "Limit 300, Used 300; retry after" in waiting.json()["error"]["message"], waiting.text
    assert stack.guard.limiter.tokens_charged(tenant) == (300, 0), "refusals charged nothing"


def _sync(stack) -> httpx.Client:
    from starlette.testclient import TestClient

    return TestClient(stack.app, base_url="http://gw")


def test_an_ingest_over_the_tpm_is_too_large_before_anything_is_embedded(stack):
    tenant, headers = _tenant(stack, 2_000)
    stack.gateway.embedder.released.set()
    text = "\n\n".join("paragraph %d " % i + "y" * 400 for i in range(40))  # ~16,500 characters, 40 chunks
    with _sync(stack) as client:
        refused = client.post(
            "/v1/collections/kb/documents", json={"documents": [{"id": "big", "text": text}]}, headers=headers
        )
        assert refused.status_code == 429 and refused.headers["x-should-retry"] == "false"
        limit, requested = map(int, TOO_LARGE.search(refused.json()["error"]["message"]).groups())
        assert limit == 2_000 and requested > 4_000
        small = client.post(
            "/v1/collections/kb/documents", json={"documents": [{"id": "small", "text": text[:1500]}]}, headers=headers
        )
        assert small.status_code == 200, small.text
    assert stack.gateway.embedder.calls == [len(paragraph_chunks(text[:1500]))], "only the small ingest embedded"
    charged, carried = stack.guard.limiter.tokens_charged(tenant)
    assert charged == small.json()["tokens"] and carried == 0


def test_a_rag_query_over_the_tpm_is_too_large_before_its_question_is_embedded(stack):
    tenant, headers = _tenant(stack, 100)
    with _sync(stack) as client:
        refused = client.post(
            "/v1/rag/query",
            json={"collection": "kb", "question": "How long is the leave?", "max_tokens": 256},
            headers=headers,
        )
    assert refused.status_code == 429, refused.text
    assert TOO_LARGE.search(refused.json()["error"]["message"]).groups() == ("100", str(256 + 8))
    assert stack.gateway.embedder.queries == [] and stack.guard.limiter.tokens_charged(tenant) == (0, 0)


def test_an_ingest_hears_every_chunk_before_embedding_and_a_refusal_embeds_nothing():
    embedder, index = FakeEmbedder(), RecordingIndex()
    pipeline = RagPipeline(embedder, index, _pipeline_settings())
    heard: list[list[str]] = []

    async def refuse(texts):
        heard.append(texts)
        raise RuntimeError("over the TPM")

    docs = [DocumentInput(id="a", text="First paragraph.\n\nSecond paragraph."), DocumentInput(id="b", text="Third.")]
    with pytest.raises(RuntimeError, match="over the TPM"):
        asyncio.run(pipeline.ingest("t", "kb", docs, before_embedding=refuse))
    assert [len(texts) for texts in heard] == [3] and embedder.document_calls == [] and index.upserts == [], (
        "nothing embedded or stored"
    )


def _pipeline_settings():
    from rag.retrieval.pipeline import PipelineSettings

    return PipelineSettings.model_validate(gateway_settings().model_dump())
