"""Knowledge-base and RAG routes, mixed into the gateway: ingest (gateway/routes/ingestion.py),
collections, and RAG queries with citations.

The RAG logic itself is rag.retrieval.pipeline.RagPipeline; these routes validate the request, adapt the
gateway's Ray handles to the pipeline (gateway/rag_adapters.py) and shape its results as HTTP.
"""

from __future__ import annotations

import json

from fastapi import HTTPException, Query, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gateway.on_demand_gate import OnDemandGate
from gateway.http_errors import unavailable
from gateway.middleware.tenant_guard import record_usage, refuse_if_too_large, reserve_tokens
from gateway.rag_adapters import GatewayChat, RayEmbedder, RayIndex, pipeline_settings
from gateway.routes.ingestion import IngestRoutes
from gateway.routes.no_answer_response import no_answer_response
from gateway.schemas import AddDocumentsRequest, RagOptions, RagQueryRequest, SearchRequest
from gateway.streams import rag_stream, tracked_stream
from gateway.work import page_limit, run_to_completion, without_credentials
from rag.documents.ids import validate_collection, validate_document_id
from rag.retrieval.answer_trim import finish_answer
from rag.retrieval.filters import InvalidFilter, normalize_filters
from rag.retrieval.pipeline import Grounding, InvalidQuery, RagPipeline
from rag.retrieval.prompt import citations, rag_messages
from tenancy.limits import estimate_ingest_tokens, estimate_text_tokens
from vllm_bridge.compat import ChatCompletionRequest

# The search route's `filters` query parameter is JSON; bounded so parsing it stays cheap.
FILTERS_PARAM_MAX_CHARS = 4096


class KnowledgeRoutes(IngestRoutes):
    """Needs from the gateway: _embedder, _retriever, _settings, _embed_model_id, _engines, _tenant,
    _require_model, _check_prompt_fits, _check_prompt_length, _engine, _recheck_health;
    _on_demand when engines are on demand."""

    _on_demand = OnDemandGate(None, set())  # no engine on demand unless the Ray binding hands a coordinator in

    def _pipeline(self, request: Request, model: str | None = None, prompt_model: str | None = None) -> RagPipeline:
        """The pipeline for one request: its embedder charges this request's tenant; with a chat model
        (`model` asks it, `prompt_model` only prompts it) the context budget counts that model's tokens."""
        chat = GatewayChat(self, request, model) if model else None
        embedder = RayEmbedder(
            self._embedder, lambda texts: self._embed_and_charge(request, texts), self._tenant(request)
        )
        counted = {}
        if model or prompt_model:
            tokenizer = self._engines[model or prompt_model].tokenizer
            counted["count_tokens"] = lambda text: len(tokenizer.encode(text, add_special_tokens=False))
        return RagPipeline(embedder, RayIndex(self._retriever), pipeline_settings(self), chat=chat, **counted)

    async def _chat_checked(self, body: ChatCompletionRequest, request: Request) -> Response:
        """The chat engine's response to a prompt the gateway has checked and charged."""
        await self._check_prompt_fits(body, request)
        model = body.model or self._chat_model_id
        call = super().chat(body, without_credentials(request))
        return await self._on_demand.run(model, request, lambda: self._engine(call, model))

    # ---- knowledge bases (ingest: gateway/routes/ingestion.py) ------------------------------------
    async def ingest_body(self, collection: str, body: AddDocumentsRequest, request: Request) -> Response:
        """The ingest (IngestRoutes.ingest_body, JSON or multipart), after its estimated embedding tokens
        are reserved: a 429 when the tenant's minute cannot hold them, so parallel ingests cannot each
        start on a budget of one token, and "Request too large" when they are over the whole TPM. The
        reservation is held until the ingest ends, covering its embedder calls (record_usage), and settled to
        what they read. Files (PDF, DOCX, PPTX) have no text before extraction: their chunks are reserved
        once extracted and chunked, before the first is embedded (IngestRoutes._reserve_chunks)."""
        estimate = estimate_ingest_tokens(
            [doc.text or "" for doc in body.documents], self._settings.chunk_tokens, self._settings.chunk_overlap
        )
        await reserve_tokens(request, estimate, "characters / 4 of the documents, with the chunks' overlap")
        return await super().ingest_body(collection, body, request)

    async def list_collections(self, request: Request) -> Response:
        collections = await self._retriever.list_collections.remote(self._tenant(request))
        return JSONResponse({"object": "list", "data": collections})

    async def get_collection(self, collection: str, request: Request) -> Response:
        """Counts only; the documents themselves are paged by list_documents."""
        validate_collection(collection)
        return JSONResponse(await self._retriever.collection_info.remote(self._tenant(request), collection))

    async def list_documents(
        self,
        collection: str,
        request: Request,
        limit: int | None = Query(
            None,
            ge=1,
            description="Documents in the page (default rag.documents_page_default, at most rag.documents_page_max).",
        ),
        after: str | None = Query(
            None, description="A document id: the page starts after it (the previous page's last_id)."
        ),
    ) -> Response:
        """One page of the collection's documents in id order, with has_more and first_id/last_id."""
        validate_collection(collection)
        size = page_limit(limit, self._settings)
        if after is not None:
            validate_document_id(after)
        page = await self._retriever.list_documents.remote(self._tenant(request), collection, size, after)
        return JSONResponse(page)

    async def delete_document(self, collection: str, document_id: str, request: Request) -> Response:
        validate_collection(collection)
        validate_document_id(document_id)
        await self._retriever.delete_document.remote(self._tenant(request), collection, document_id)
        return JSONResponse({"deleted": document_id, "collection": collection})

    async def delete_collection(self, collection: str, request: Request) -> Response:
        validate_collection(collection)
        await self._retriever.delete_collection.remote(self._tenant(request), collection)
        return JSONResponse({"deleted": collection})

    # ---- search and RAG ---------------------------------------------------------------------
    async def search_collection(
        self,
        collection: str,
        request: Request,
        q: str = Query(..., min_length=1, description="The question or search text."),
        top_k: int | None = Query(
            None, ge=1, description="Passages to return (default rag.default_top_k, at most rag.max_top_k)."
        ),
        filters: str | None = Query(
            None,
            max_length=FILTERS_PARAM_MAX_CHARS,
            description='Metadata filters as JSON, e.g. {"source": "hr", "year": {"in": '
            "[2024, 2025]}}; POST the same route for a JSON body instead.",
        ),
    ) -> Response:
        """Passages without generation: text, score, document and chunk ids, offsets, metadata."""
        return await self._search(request, collection, q, top_k, _filters_param(filters))

    async def search_collection_post(self, collection: str, body: SearchRequest, request: Request) -> Response:
        return await self._search(request, collection, body.q, body.top_k, body.filters)

    async def _search(
        self, request: Request, collection: str, text: str, top_k: int | None, filters: dict | None
    ) -> Response:
        validate_collection(collection)
        try:
            result = await self._pipeline(request).search(
                self._tenant(request), collection, text, top_k, filters=filters
            )
        except InvalidQuery as exc:
            raise HTTPException(exc.status, str(exc)) from None
        return JSONResponse(
            {
                "object": "list",
                "collection": collection,
                "query": text,
                "retrieval": self._settings.retrieval,
                "best_similarity": result.best_similarity,
                "data": citations(result.hits),
            }
        )

    async def _augment_chat(
        self, request: Request, options: RagOptions, messages: list[dict], model: str | None = None
    ) -> tuple[list[dict], Grounding]:
        """Chat-with-RAG: the messages with the retrieved context prepended, and the grounding."""
        validate_collection(options.collection)
        try:
            return await self._pipeline(request, prompt_model=model).augment_chat(
                self._tenant(request),
                options.collection,
                messages,
                options.top_k,
                options.filters,
                options.min_score,
                options.context_tokens,
            )
        except InvalidQuery as exc:
            raise HTTPException(exc.status, str(exc)) from None

    async def _no_answer(
        self, request: Request, model: str, messages: list[dict], max_tokens: int | None, stream: bool, choices: int = 1
    ) -> Response:
        """The fixed reply for a question the knowledge base has nothing on; no generation, no tokens charged.
        A prompt that could never fit the model is still a 400, as it would be if answered."""
        await self._check_prompt_length(ChatCompletionRequest(model=model, messages=messages, max_tokens=max_tokens))
        return no_answer_response(model, stream, choices)

    async def rag_query(self, body: RagQueryRequest, request: Request) -> Response:
        model = await self._require_model(request, body.model)
        validate_collection(body.collection)
        await self._refuse_rag_too_large(request, body.question, body.max_tokens or self._settings.answer_max_tokens)
        if body.stream:
            return await self._rag_answer(body, request, model)
        # Non-streamed: runs to the end even if the client hangs up, so what ran is charged (gateway._generate).
        return await run_to_completion(self._rag_answer(body, request, model))

    async def _rag_answer(self, body: RagQueryRequest, request: Request, model: str) -> Response:
        try:
            result = await self._pipeline(request, model).answer(
                self._tenant(request),
                body.collection,
                body.question,
                body.top_k,
                max_tokens=body.max_tokens,
                temperature=body.temperature,
                stream=body.stream,
                filters=body.filters,
                min_score=body.min_score,
                context_tokens=body.context_tokens,
            )
        except InvalidQuery as exc:
            raise HTTPException(exc.status, str(exc)) from None
        response, cited, grounding = result.reply, result.citations, result.grounding
        if response is None:
            response = await self._no_answer(
                request,
                model,
                rag_messages(body.question, []),
                body.max_tokens or self._settings.answer_max_tokens,
                body.stream,
            )
        retrieval = {"refused": not grounding.answerable, "best_similarity": grounding.best_similarity}
        if isinstance(response, StreamingResponse):
            tracked = tracked_stream(
                response.body_iterator,
                request,
                model,
                None,
                True,
                False,
                on_broken=self._recheck_health,
                trim_at_cap=self._settings.trim_capped_answers,
            )
            return StreamingResponse(rag_stream(tracked, cited, retrieval), media_type="text/event-stream")
        if response.status_code >= 500:
            self._healthy_until = 0.0
            return unavailable(
                "chat", bytes(response.body).decode(errors="replace")[:300], self._settings.unavailable_retry_after_s
            )
        payload = json.loads(response.body)
        await record_usage(request, model, payload.get("usage"))
        if response.status_code >= 400 or not payload.get("choices"):
            return response  # the engine's own OpenAI-shaped error, passed on as it is
        choice = payload["choices"][0]
        answer, finish_reason = choice["message"].get("content") or "", choice.get("finish_reason")
        if self._settings.trim_capped_answers:  # at the token cap: up to its last complete sentence
            answer = finish_answer(answer, finish_reason)
        return JSONResponse(
            {
                "answer": answer,
                "finish_reason": finish_reason,
                "citations": cited,
                **retrieval,
                "usage": payload.get("usage", {}),
                "model": payload.get("model"),
                "id": payload.get("id"),
            }
        )

    @staticmethod
    async def _refuse_rag_too_large(request: Request, question: str, max_tokens: int) -> None:
        """Before the question is embedded and searched: the "Request too large" 429 when the question and the
        answer's max_tokens alone are over the tenant's whole TPM (the prompt's context only adds to them)."""
        await refuse_if_too_large(
            request,
            estimate_text_tokens([question]) + max_tokens,
            "the question at characters / 4 + max_tokens, before any context is added",
        )


def _filters_param(raw: str | None) -> dict | None:
    """The search route's JSON `filters` parameter: 400 if it is not JSON, 422 naming the key if it
    is not a valid filter (as a JSON body's filters would be)."""
    if raw is None or not raw.strip():
        return None
    try:
        parsed = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise HTTPException(400, f"filters is not valid JSON: {str(exc)[:200]}") from None
    try:
        return normalize_filters(parsed) or None
    except InvalidFilter as exc:
        raise HTTPException(422, f"invalid request: {exc}") from None
