"""Knowledge-base and RAG routes, mixed into the gateway: ingest (deployments/ingest.py),
collections, and RAG queries with citations.

The RAG logic itself is rag.pipeline.RagPipeline; these routes validate the request, adapt the
gateway's Ray handles to the pipeline (deployments/rag_adapters.py) and shape its results as HTTP.
"""

from __future__ import annotations

import json

from fastapi import HTTPException, Request
from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from deployments.errors import unavailable
from deployments.ingest import IngestRoutes
from deployments.rag_adapters import GatewayChat, RayEmbedder, RayIndex
from deployments.schemas import RagQueryRequest
from deployments.streams import rag_stream, tracked_stream
from deployments.tenants import record_usage
from deployments.work import without_credentials
from rag.ids import validate_collection, validate_document_id
from rag.pipeline import InvalidQuery, PipelineSettings, RagPipeline
from rag.prompt import RetrievedChunk


class KnowledgeRoutes(IngestRoutes):
    """Needs from the gateway: _embedder, _retriever, _settings, _embed_model_id, _tenant,
    _require_model, _check_prompt_fits, _engine, _recheck_health."""

    def _pipeline(self, request: Request, model: str | None = None) -> RagPipeline:
        """The pipeline for one request: its embedder charges this request's tenant."""
        chat = GatewayChat(self, request, model) if model else None
        embedder = RayEmbedder(self._embedder, lambda texts: self._embed_and_charge(request, texts))
        return RagPipeline(embedder, RayIndex(self._retriever),
                           PipelineSettings.model_validate(self._settings), chat=chat)

    async def _chat_checked(self, body: ChatCompletionRequest, request: Request) -> Response:
        """The chat engine's response to a prompt the gateway has checked and charged."""
        await self._check_prompt_fits(body, request)
        return await self._engine(super().chat(body, without_credentials(request)))

    # ---- knowledge bases (ingest: deployments/ingest.py) ------------------------------------
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
    async def _augment_chat(self, request: Request, collection: str, messages: list[dict],
                            top_k: int | None) -> tuple[list[dict], list[RetrievedChunk]]:
        """Chat-with-RAG: the messages with the retrieved context prepended, and the hits."""
        validate_collection(collection)
        try:
            return await self._pipeline(request).augment_chat(self._tenant(request), collection, messages, top_k)
        except InvalidQuery as exc:
            raise HTTPException(400, str(exc)) from None

    async def rag_query(self, body: RagQueryRequest, request: Request) -> Response:
        model = await self._require_model(request, body.model)
        validate_collection(body.collection)
        try:
            result = await self._pipeline(request, model).answer(
                self._tenant(request), body.collection, body.question, body.top_k, max_tokens=body.max_tokens,
                temperature=body.temperature, stream=body.stream)
        except InvalidQuery as exc:
            raise HTTPException(400, str(exc)) from None
        response, cited = result.reply, result.citations
        if isinstance(response, StreamingResponse):
            tracked = tracked_stream(response.body_iterator, request, model, None, True, False,
                                     on_broken=self._recheck_health)
            return StreamingResponse(rag_stream(tracked, cited), media_type="text/event-stream")
        if response.status_code >= 500:
            self._healthy_until = 0.0
            return unavailable("chat", bytes(response.body).decode(errors="replace")[:300],
                               self._settings["unavailable_retry_after_s"])
        payload = json.loads(response.body)
        await record_usage(request, model, payload.get("usage"))
        if response.status_code >= 400 or not payload.get("choices"):
            return response  # the engine's own OpenAI-shaped error, passed on as it is
        answer = payload["choices"][0]["message"].get("content") or ""
        return JSONResponse({"answer": answer, "citations": cited, "usage": payload.get("usage", {}),
                             "model": payload.get("model"), "id": payload.get("id")})
