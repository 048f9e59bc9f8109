"""The RAG pipeline's protocols (rag/retrieval/interfaces.py) over the gateway's Ray handles.

Built per request: the embedder adapter charges the request's tenant for the document tokens it
embeds (as before the pipeline existed, questions are not charged), the chat adapter goes through
the gateway's own checks (prompt length, TPM reservation, per-tenant cache salt).
"""

from __future__ import annotations

from typing import Awaitable, Callable

import numpy as np
from fastapi import Request

from gateway.streams import force_stream_usage
from rag.documents.chunking import Chunk
from rag.retrieval.pipeline import PipelineSettings
from rag.retrieval.search import SearchQuery, SearchResult
from vllm_bridge.compat import ChatCompletionRequest


class RayEmbedder:
    def __init__(self, handle, embed_and_charge: Callable[[list[str]], Awaitable[dict]], tenant: str):
        self._handle = handle
        self._embed_and_charge = embed_and_charge  # the gateway's: embeds and records the tenant's usage
        self._tenant = tenant  # whose turn a question's batch takes in the embedder

    async def chunk_documents(self, texts: list[str]) -> list[list[Chunk]]:
        return await self._handle.chunk_documents.remote(texts)

    async def embed_documents(self, texts: list[str]) -> np.ndarray:
        return (await self._embed_and_charge(texts))["vectors"]

    async def embed_query(self, text: str) -> np.ndarray:
        return await self._handle.embed_query.remote(text, self._tenant)


class RayIndex:
    def __init__(self, handle):
        self._handle = handle

    async def upsert_documents(self, tenant: str, collection: str, documents: list[tuple]) -> list[int]:
        return await self._handle.upsert_documents.remote(tenant, collection, documents)

    async def search(self, tenant: str, collection: str, query: SearchQuery) -> SearchResult:
        return await self._handle.search.remote(tenant, collection, query)


class GatewayChat:
    """Answers through the gateway's chat path; the reply is the engine's HTTP response."""

    def __init__(self, gateway, request: Request, model: str):
        self._gateway = gateway
        self._request = request
        self._model = model

    async def complete(self, messages: list[dict], max_tokens: int, temperature: float | None, stream: bool):
        body = ChatCompletionRequest(
            model=self._model, messages=messages, max_tokens=max_tokens, temperature=temperature, stream=stream
        )
        force_stream_usage(body)
        return await self._gateway._chat_checked(body, self._request)


def pipeline_settings(gateway) -> PipelineSettings:
    """The pipeline's settings from the gateway's (the plan's GatewaySettings, a RagSpec with more), made
    once per settings object rather than on every request."""
    cached = getattr(gateway, "_pipeline_settings_cache", None)
    if cached is None or cached[0] is not gateway._settings:
        rag_fields = gateway._settings.model_dump(include=set(PipelineSettings.model_fields))
        cached = (gateway._settings, PipelineSettings.model_validate(rag_fields))
        gateway._pipeline_settings_cache = cached
    return cached[1]
