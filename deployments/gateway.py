"""Gateway: ray.serve.llm's OpenAI ingress, extended with embeddings, knowledge bases and RAG.

The OpenAI protocol (parsing, SSE) stays with ray.serve.llm and vLLM; this class adds the
routes poolserve owns and routes embeddings to the sentence-transformers replica.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time

import numpy as np
from fastapi import FastAPI, HTTPException, Request
from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    ModelCard,
    ModelList,
)
from ray.serve.llm.ingress import OpenAiIngress
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.middleware.body_limit import RequestBodyLimitMiddleware
from starlette.responses import JSONResponse, Response, StreamingResponse

from deployments.errors import error_body
from deployments.process_memory import process_tree_rss, release_freed_heap
from deployments.streams import force_stream_usage, rag_stream, tracked_stream
from deployments.schemas import AddDocumentsRequest, RagOptions, RagQueryRequest
from deployments.tenants import ADMIN_ENDPOINTS, TenantAdminRoutes, TenantAuthMiddleware, record_usage, tenant_of
from rag.ids import validate_collection, validate_document_id
from rag.prompt import RetrievedChunk, augment_chat, citations, last_user_text, rag_messages

logger = logging.getLogger("poolserve.gateway")
HEALTH_TIMEOUT_S = 5.0
# A passed health check is trusted this long, so /healthz notices a replica that died.
HEALTHY_TTL_S = 15.0


class Gateway(TenantAdminRoutes, OpenAiIngress):
    def __init__(self, llm_deployments, model_cards, *, embedder, retriever, settings: dict):
        super().__init__(llm_deployments, model_cards)
        from transformers import AutoTokenizer

        self._embedder = embedder
        self._retriever = retriever
        self._settings = settings
        self._chat_model_id = settings["chat_model_id"]
        self._embed_model_id = settings["embed_model_id"]
        self._max_model_len = settings["max_model_len"]
        # The chat tokenizer lets the gateway refuse an over-long prompt with a 400 before the engine.
        self._tokenizer = AutoTokenizer.from_pretrained(settings["chat_model_path"])
        self._healthy_until = 0.0

    # ---- health and models -------------------------------------------------------------
    async def healthz(self) -> Response:
        if time.monotonic() > self._healthy_until:
            checks = [asyncio.ensure_future(self._ready_check(call)) for call in (
                self._embedder.ready.remote(), self._retriever.ready.remote(),
                self._default_serve_handles[self._chat_model_id].check_health.remote(),
            )]
            done, pending = await asyncio.wait(checks, timeout=HEALTH_TIMEOUT_S)
            for task in pending:
                task.cancel()
            failed = [task.result() for task in done if task.result()]
            if pending or failed:
                return error_body(503, f"not ready: {failed or 'replicas still starting'}", "service_unavailable")
            self._healthy_until = time.monotonic() + HEALTHY_TTL_S
        return JSONResponse({"status": "ok"})

    @staticmethod
    async def _ready_check(call) -> str | None:
        """None when the replica answered, else why not (a replica still starting raises)."""
        try:
            await call
            return None
        except Exception as exc:
            return type(exc).__name__

    def _embed_card(self) -> ModelCard:
        return ModelCard(id=self._embed_model_id, object="model", owned_by="poolserve", permission=[],
                         metadata={"model_id": self._embed_model_id, "task": "embedding"})

    async def models(self, request: Request) -> ModelList:
        listing = await super().models()
        cards = [*listing.data, self._embed_card()]
        return ModelList(data=[card for card in cards if self._may_use(request, card.id)])

    async def model_data(self, model: str, request: Request) -> ModelCard:
        await self._require_model(request, model)
        if model == self._embed_model_id:
            return self._embed_card()
        return await super().model_data(model)

    # ---- tenants ----------------------------------------------------------------------------
    @staticmethod
    def _may_use(request: Request, model: str) -> bool:
        tenant = tenant_of(request)
        return tenant is None or tenant.may_use_model(model)

    async def _require_model(self, request: Request, model: str | None) -> str:
        """The served model a request names (or the chat default): 404 unknown, 403 not allowed."""
        model = model or self._chat_model_id
        # Exact names only: ray.serve.llm would read "model:suffix" as a LoRA adapter (none is served).
        if model != self._embed_model_id and model not in self._model_cards:
            raise HTTPException(404, f"model {model!r} does not exist; GET /v1/models lists the served models")
        if not self._may_use(request, model):
            raise HTTPException(403, f"this API key's tenant may not use model {model!r}")
        return model

    def _tenant(self, request: Request) -> str:
        return tenant_of(request).name

    async def _finish(self, request: Request, model: str, response: Response, cited: list[dict] | None,
                      usage_wanted: tuple[bool, bool]) -> Response:
        """Record usage (streams: when they end) and attach citations for chat-with-RAG."""
        if isinstance(response, StreamingResponse):
            stream = tracked_stream(response.body_iterator, request, model, cited, *usage_wanted)
            return StreamingResponse(stream, media_type="text/event-stream")
        payload = json.loads(response.body)
        await record_usage(request, model, payload.get("usage"), response.status_code)
        if cited is None:
            return response
        payload["citations"] = cited
        return JSONResponse(payload, status_code=response.status_code)

    # ---- chat ----------------------------------------------------------------------------
    def _count_chat_tokens(self, messages: list) -> int:
        flat = [{**m, "content": _text_of(m.get("content"))} for m in messages]
        try:
            ids = self._tokenizer.apply_chat_template(flat, tokenize=True, add_generation_prompt=True)
        except Exception as exc:  # a malformed message shape is the client's mistake
            raise HTTPException(400, f"messages could not be rendered with the chat template: {exc}")
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return len(ids)

    def _refuse_if_too_long(self, tokens: int, body) -> None:
        wanted = getattr(body, "max_completion_tokens", None) or body.max_tokens or 1
        if tokens >= self._max_model_len or tokens + wanted > self._max_model_len:
            raise HTTPException(
                400,
                f"prompt is {tokens} tokens and max_tokens is {wanted}; together they exceed the model's "
                f"context of {self._max_model_len} tokens. Shorten the prompt or lower max_tokens.",
            )

    async def _check_prompt_fits(self, body: ChatCompletionRequest) -> None:
        # Tokenizing a multi-megabyte prompt takes a while: keep it off the event loop.
        tokens = await run_in_threadpool(self._count_chat_tokens, [dict(m) for m in body.messages])
        self._refuse_if_too_long(tokens, body)

    async def _check_completion_fits(self, body: CompletionRequest) -> None:
        prompts = body.prompt if isinstance(body.prompt, list) else [body.prompt]
        for prompt in prompts:
            if isinstance(prompt, str):
                tokens = len(await run_in_threadpool(self._tokenizer.encode, prompt))
            elif isinstance(prompt, list):  # token ids, or a list of them
                tokens = len(prompt)
            else:
                continue
            self._refuse_if_too_long(tokens, body)

    async def chat(self, body: ChatCompletionRequest, request: Request) -> Response:
        rag = (body.model_extra or {}).pop("rag", None)
        model = await self._require_model(request, body.model)  # 404/403 before any retrieval
        if model == self._embed_model_id:
            raise HTTPException(400, f"model {model!r} is an embedding model; use /v1/embeddings")
        body.model = model
        usage_wanted = force_stream_usage(body)
        cited = None
        if rag is not None:
            options = RagOptions.model_validate(rag)
            messages = [dict(m) for m in body.messages]
            hits = await self._retrieve(self._tenant(request), options.collection, last_user_text(messages),
                                        options.top_k)
            body.messages = augment_chat(messages, hits)
            cited = citations(hits)
        await self._check_prompt_fits(body)
        response = await super().chat(body, _without_credentials(request))
        return await self._finish(request, model, response, cited, usage_wanted)

    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        model = await self._require_model(request, body.model)
        body.model = model
        usage_wanted = force_stream_usage(body)
        await self._check_completion_fits(body)
        response = await super().completions(body, _without_credentials(request))
        return await self._finish(request, model, response, None, usage_wanted)

    # ---- embeddings ----------------------------------------------------------------------
    async def embeddings(self, body: EmbeddingRequest, request: Request) -> Response:
        model = body.model or self._embed_model_id
        await self._require_model(request, model)
        if model != self._embed_model_id:
            raise HTTPException(400, f"model {body.model!r} is a chat model; embeddings come from {self._embed_model_id!r}")
        texts = getattr(body, "input", None)
        if isinstance(texts, str):
            texts = [texts]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise HTTPException(400, "input must be a non-empty string or list of strings (token ids are not accepted)")
        if len(texts) > 2048:
            raise HTTPException(400, f"input has {len(texts)} items; the limit is 2048")
        if getattr(body, "dimensions", None):
            raise HTTPException(400, f"dimensions is not supported: {self._embed_model_id} has one output size")
        result = await self._embedder.embed.remote(texts)
        vectors: np.ndarray = result["vectors"]
        as_base64 = getattr(body, "encoding_format", "float") == "base64"
        data = [
            {"object": "embedding", "index": i,
             "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if as_base64 else v.tolist()}
            for i, v in enumerate(vectors)
        ]
        usage = {"prompt_tokens": result["tokens"], "total_tokens": result["tokens"]}
        await record_usage(request, self._embed_model_id, usage)
        return JSONResponse({"object": "list", "data": data, "model": self._embed_model_id, "usage": usage},
                            background=_release_heap_after_sending())

    # ---- knowledge bases -----------------------------------------------------------------
    async def add_documents(self, collection: str, body: AddDocumentsRequest, request: Request) -> Response:
        tenant = self._tenant(request)
        validate_collection(collection)
        limit = self._settings["max_documents_per_request"]
        if len(body.documents) > limit:
            raise HTTPException(400, f"{len(body.documents)} documents in one request; the limit is {limit}")
        ids = [validate_document_id(doc.id) for doc in body.documents]
        if len(set(ids)) != len(ids):
            raise HTTPException(400, "document ids repeat within the request")
        for doc in body.documents:
            if len(doc.text) > self._settings["max_document_chars"]:
                raise HTTPException(400, f"document {doc.id!r} has {len(doc.text)} characters; the limit is "
                                         f"{self._settings['max_document_chars']}")
        # Chunk and embed everything before the first write, so a failure stores nothing.
        chunked = await asyncio.gather(*(self._embedder.chunk.remote(doc.text) for doc in body.documents))
        all_chunks = [chunk for chunks in chunked for chunk in chunks]
        embedded = await self._embedder.embed.remote(all_chunks) if all_chunks else {"vectors": [], "tokens": 0}
        await record_usage(request, self._embed_model_id, {"prompt_tokens": embedded["tokens"]})
        results, start = [], 0
        for doc, chunks in zip(body.documents, chunked):
            vectors = embedded["vectors"][start:start + len(chunks)]
            start += len(chunks)
            count = await self._retriever.upsert_document.remote(
                tenant, collection, doc.id, chunks, vectors, doc.metadata, len(doc.text))
            results.append({"id": doc.id, "chunks": count})
        return JSONResponse({"collection": collection, "documents": results,
                             "chunks": sum(r["chunks"] for r in results)}, background=_release_heap_after_sending())

    async def list_collections(self, request: Request) -> Response:
        collections = await self._retriever.list_collections.remote(self._tenant(request))
        return JSONResponse({"object": "list", "data": collections})

    async def get_collection(self, collection: str, request: Request) -> Response:
        validate_collection(collection)
        return JSONResponse(await self._retriever.collection_info.remote(self._tenant(request), collection))

    async def delete_document(self, collection: str, document_id: str, request: Request) -> Response:
        validate_collection(collection)
        validate_document_id(document_id)
        await self._retriever.delete_document.remote(self._tenant(request), collection, document_id)
        return JSONResponse({"deleted": document_id, "collection": collection})

    async def delete_collection(self, collection: str, request: Request) -> Response:
        validate_collection(collection)
        await self._retriever.delete_collection.remote(self._tenant(request), collection)
        return JSONResponse({"deleted": collection})

    # ---- RAG ------------------------------------------------------------------------------
    async def _retrieve(self, tenant: str, collection: str, question: str, top_k: int | None) -> list[RetrievedChunk]:
        validate_collection(collection)
        top_k = top_k or self._settings["default_top_k"]
        if top_k > self._settings["max_top_k"]:
            raise HTTPException(400, f"top_k {top_k} is above the limit of {self._settings['max_top_k']}")
        if not question.strip():
            raise HTTPException(400, "no question: the last user message is empty")
        vector = (await self._embedder.embed.remote([question]))["vectors"][0]
        return await self._retriever.search.remote(tenant, collection, vector, top_k)

    async def rag_query(self, body: RagQueryRequest, request: Request) -> Response:
        model = await self._require_model(request, body.model)
        hits = await self._retrieve(self._tenant(request), body.collection, body.question, body.top_k)
        chat_body = ChatCompletionRequest(
            model=model, messages=rag_messages(body.question, hits),
            max_tokens=body.max_tokens or self._settings["answer_max_tokens"], temperature=body.temperature,
            stream=body.stream,
        )
        force_stream_usage(chat_body)
        await self._check_prompt_fits(chat_body)
        response = await super().chat(chat_body, _without_credentials(request))
        cited = citations(hits)
        if isinstance(response, StreamingResponse):
            tracked = tracked_stream(response.body_iterator, request, model, None, True, False)
            return StreamingResponse(rag_stream(tracked, cited), media_type="text/event-stream")
        payload = json.loads(response.body)
        await record_usage(request, model, payload.get("usage"))
        answer = payload["choices"][0]["message"].get("content") or ""
        return JSONResponse({"answer": answer, "citations": cited, "usage": payload.get("usage", {}),
                             "model": payload.get("model"), "id": payload.get("id")})

    # ---- operations ---------------------------------------------------------------------------
    async def status(self) -> Response:
        chat_handle = self._default_serve_handles[self._chat_model_id]
        measured = await asyncio.gather(
            chat_handle.memory.remote(), self._embedder.memory.remote(), self._retriever.memory.remote(),
            return_exceptions=True,
        )
        names = ["chat", "embedder", "retriever"]
        replicas = [{"name": n, **(m if isinstance(m, dict) else {"error": str(m)})} for n, m in zip(names, measured)]
        replicas.append({"name": "gateway", **process_tree_rss()})
        planned = self._settings.get("planned_bytes", {})
        at_rest = self._settings.get("planned_at_rest_bytes", {})
        for replica in replicas:
            replica["planned_bytes"] = planned.get(replica["name"])
            replica["planned_at_rest_bytes"] = at_rest.get(replica["name"])
        return JSONResponse({"replicas": replicas, "retriever": await self._retriever.stats.remote()})


def _release_heap_after_sending() -> BackgroundTask:
    """Bulk bodies (documents in, vectors out) leave megabytes in glibc's free lists; return them."""
    return BackgroundTask(release_freed_heap, collect=False)


def _without_credentials(request: Request) -> Request:
    """The request as forwarded to the chat replica: the tenant's key stays at the gateway."""
    headers = [(k, v) for k, v in request.scope.get("headers", []) if k != b"authorization"]
    return Request({**request.scope, "headers": headers}, request.receive)


def _text_of(content) -> str:
    """Message content as text, for counting: OpenAI content parts are flattened like vLLM does."""
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


ENDPOINTS = {
    "models": lambda app: app.get("/v1/models", response_model=ModelList),
    "model_data": lambda app: app.get("/v1/models/{model:path}", response_model=ModelCard),
    "completions": lambda app: app.post("/v1/completions"),
    "chat": lambda app: app.post("/v1/chat/completions"),
    "embeddings": lambda app: app.post("/v1/embeddings"),
    "healthz": lambda app: app.get("/healthz"),
    **ADMIN_ENDPOINTS,
    "status": lambda app: app.get("/status"),
    # `:path` lets a name with '/' reach validation and get a 400 instead of a routing 404.
    "add_documents": lambda app: app.post("/v1/collections/{collection:path}/documents"),
    "list_collections": lambda app: app.get("/v1/collections"),
    "delete_document": lambda app: app.delete("/v1/collections/{collection:path}/documents/{document_id:path}"),
    "get_collection": lambda app: app.get("/v1/collections/{collection:path}"),
    "delete_collection": lambda app: app.delete("/v1/collections/{collection:path}"),
    "rag_query": lambda app: app.post("/v1/rag/query"),
}


def make_app(guard_config: dict, max_body_bytes: int) -> FastAPI:
    """The gateway's FastAPI app: error mapping, tenant auth, and outermost a body-size limit.
    No CORS middleware: cross-origin browser calls stay closed unless an operator adds it."""
    from deployments.errors import install_error_handlers

    app = FastAPI(title="poolserve", docs_url="/docs", redoc_url=None)
    install_error_handlers(app)
    app.add_middleware(TenantAuthMiddleware, guard_config=guard_config)
    app.add_middleware(RequestBodyLimitMiddleware, max_body_size=max_body_bytes)
    return app
