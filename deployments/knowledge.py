"""Knowledge-base and RAG routes, mixed into the gateway: ingest (atomic, paid even if the client
leaves), collections, and RAG queries with citations."""

from __future__ import annotations

import asyncio
import json

from fastapi import HTTPException, Request
from ray.llm._internal.serve.core.configs.openai_api_models import ChatCompletionRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from deployments.errors import unavailable
from deployments.schemas import AddDocumentsRequest, RagQueryRequest
from deployments.streams import force_stream_usage, rag_stream, tracked_stream
from deployments.tenants import record_usage
from deployments.work import release_heap_after_sending, run_to_completion, without_credentials
from rag.ids import validate_collection, validate_document_id
from rag.prompt import RetrievedChunk, citations, rag_messages


class KnowledgeRoutes:
    """Needs from the gateway: _embedder, _retriever, _settings, _embed_model_id, _tenant,
    _require_model, _check_prompt_fits, _engine, _recheck_health."""

    # ---- knowledge bases -----------------------------------------------------------------
    async def add_documents(self, collection: str, body: AddDocumentsRequest, request: Request) -> Response:
        tenant = self._tenant(request)
        validate_collection(collection)
        limit = self._settings["max_documents_per_request"]
        if len(body.documents) > limit:
            raise HTTPException(400, f"documents has {len(body.documents)} items; the limit is {limit} per request "
                                     "(rag.max_documents_per_request)")
        ids = [validate_document_id(doc.id) for doc in body.documents]
        if len(set(ids)) != len(ids):
            raise HTTPException(400, "documents[].id repeats within the request; each id may appear once")
        max_chars = self._settings["max_document_chars"]
        for i, doc in enumerate(body.documents):
            if len(doc.text) > max_chars:
                raise HTTPException(413, f"documents[{i}].text (id {doc.id!r}) has {len(doc.text)} characters; the "
                                         f"limit is {max_chars} (rag.max_document_chars)")
        # The whole ingest finishes even if the client hangs up (it is atomic and it is paid for).
        results = await run_to_completion(self._ingest(request, tenant, collection, body.documents))
        return JSONResponse({"collection": collection, "documents": results,
                             "chunks": sum(r["chunks"] for r in results)}, background=release_heap_after_sending())

    async def _ingest(self, request: Request, tenant: str, collection: str, documents) -> list[dict]:
        """Chunk and embed everything, then store all documents in one transaction: all or none."""
        chunked = await asyncio.gather(*(self._embedder.chunk.remote(doc.text) for doc in documents))
        all_chunks = [chunk for chunks in chunked for chunk in chunks]
        embedded = await self._embed_and_charge(request, all_chunks) if all_chunks else {"vectors": [], "tokens": 0}
        batch, start = [], 0
        for doc, chunks in zip(documents, chunked):
            batch.append((doc.id, chunks, embedded["vectors"][start:start + len(chunks)], doc.metadata, len(doc.text)))
            start += len(chunks)
        counts = await self._retriever.upsert_documents.remote(tenant, collection, batch)
        return [{"id": doc.id, "chunks": count} for doc, count in zip(documents, counts)]

    async def _embed_and_charge(self, request: Request, texts: list[str]) -> dict:
        result = await self._embedder.embed.remote(texts)
        await record_usage(request, self._embed_model_id, {"prompt_tokens": result["tokens"],
                                                           "total_tokens": result["tokens"]})
        return result

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
        await self._check_prompt_fits(chat_body, request)
        response = await self._engine(super().chat(chat_body, without_credentials(request)))
        cited = citations(hits)
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
