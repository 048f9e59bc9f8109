"""The RAG pipeline as a plain service: ingest documents, retrieve for a question, answer it.

No transport here: the embedder, the index and the chat engine come in through the protocols of
rag/interfaces.py, so the gateway adapts HTTP and Ray to it and the unit tests drive it with fakes.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Generic

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from rag.chunking import document_title, with_title
from rag.filters import InvalidFilter, normalize_filters
from rag.interfaces import ChatEngine, Embedder, KnowledgeIndex, Reply
from rag.no_answer import is_answerable
from rag.prompt import RetrievedChunk, augment_chat, citations, last_user_text, rag_messages
from rag.retrieval import RetrievalMode, SearchQuery, SearchResult


class InvalidQuery(ValueError):
    """The question or its options cannot be served; the message says why (a client error)."""


class PipelineSettings(BaseModel):
    """The parts of the profile's `rag` section the pipeline reads (planner/profile.py RagSpec)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    retrieval: RetrievalMode = Field("hybrid", description="dense, lexical or hybrid retrieval.")
    default_top_k: int = Field(4, ge=1)
    max_top_k: int = Field(20, ge=1)
    answer_max_tokens: int = Field(256, ge=1)
    embed_title: bool = Field(True, description="Embed each chunk with its document's title in front.")
    embed_batch_chunks: int = Field(1024, ge=1, description="Chunks per embedder call during an ingest.")
    min_score: float = Field(0.30, ge=-1.0, le=1.0, description="Answer only when the question's best cosine "
                             "similarity with an allowed chunk is at least this (planner/profile.py RagSpec).")


@dataclass(frozen=True)
class DocumentInput:
    id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Grounding:
    """What retrieval found for a question, and whether it is enough to answer from. When it is not,
    there are no hits to cite: the caller answers rag.no_answer.NO_ANSWER without the model."""

    hits: list[RetrievedChunk]
    best_similarity: float | None
    min_score: float
    answerable: bool

    @property
    def citations(self) -> list[dict]:
        return citations(self.hits)


@dataclass(frozen=True)
class RagAnswer(Generic[Reply]):
    grounding: Grounding
    reply: Reply | None  # None when the grounding was not answerable: the model was not asked

    @property
    def hits(self) -> list[RetrievedChunk]:
        return self.grounding.hits

    @property
    def citations(self) -> list[dict]:
        return self.grounding.citations


class RagPipeline:
    def __init__(self, embedder: Embedder, index: KnowledgeIndex, settings: PipelineSettings,
                 chat: ChatEngine | None = None):
        self.embedder = embedder
        self.index = index
        self.settings = settings
        self.chat = chat

    # ---- ingest ----------------------------------------------------------------------------
    async def ingest(self, tenant: str, collection: str, documents: list[DocumentInput]) -> list[int]:
        """Chunk and embed every document, then store them all in one transaction (all or none).
        Returns each document's chunk count."""
        chunked = await asyncio.gather(*(self.embedder.chunk(doc.text) for doc in documents))
        vectors = await self._embed([self._embedded_text(doc, chunk.text) for doc, chunks in zip(documents, chunked)
                                     for chunk in chunks])
        batch, start = [], 0
        for doc, chunks in zip(documents, chunked):
            batch.append((doc.id, chunks, vectors[start:start + len(chunks)], doc.metadata, len(doc.text)))
            start += len(chunks)
        return await self.index.upsert_documents(tenant, collection, batch)

    def _embedded_text(self, doc: DocumentInput, chunk: str) -> str:
        """A chunk deep in a long document rarely names what it belongs to; with the title in front
        its vector does (the stored text, which citations and prompts show, stays the chunk)."""
        return with_title(document_title(doc.text, doc.metadata), chunk) if self.settings.embed_title else chunk

    async def _embed(self, texts: list[str]) -> np.ndarray:
        """Embedded in bounded calls, so one large ingest is not one huge message to the embedder."""
        step = self.settings.embed_batch_chunks
        parts = [np.asarray(await self.embedder.embed_documents(texts[i:i + step]), dtype=np.float32)
                 for i in range(0, len(texts), step)]
        return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)

    # ---- query -----------------------------------------------------------------------------
    def _top_k(self, top_k: int | None) -> int:
        top_k = top_k or self.settings.default_top_k
        if top_k > self.settings.max_top_k:
            raise InvalidQuery(f"top_k {top_k} is above the limit of {self.settings.max_top_k}")
        return top_k

    async def search(self, tenant: str, collection: str, question: str, top_k: int | None = None,
                     mode: RetrievalMode | None = None, filters: dict | None = None) -> SearchResult:
        """The question's top_k chunks among those of documents matching `filters`, best first."""
        top_k = self._top_k(top_k)
        if not question.strip():
            raise InvalidQuery("no question: the question (in chat, the last user message) is empty")
        try:
            filters = normalize_filters(filters) or None
        except InvalidFilter as exc:
            raise InvalidQuery(str(exc)) from None
        mode = mode or self.settings.retrieval
        vector = None if mode == "lexical" else await self.embedder.embed_query(question)
        query = SearchQuery(text=question, top_k=top_k, mode=mode, vector=vector, filters=filters)
        return await self.index.search(tenant, collection, query)

    async def retrieve(self, tenant: str, collection: str, question: str, top_k: int | None = None,
                       mode: RetrievalMode | None = None, filters: dict | None = None) -> list[RetrievedChunk]:
        return (await self.search(tenant, collection, question, top_k, mode, filters)).hits

    async def ground(self, tenant: str, collection: str, question: str, top_k: int | None = None,
                     filters: dict | None = None, min_score: float | None = None) -> Grounding:
        """Retrieve, then decide whether the passages are related enough to answer from."""
        threshold = self.settings.min_score if min_score is None else min_score
        result = await self.search(tenant, collection, question, top_k, filters=filters)
        answerable = is_answerable(result, threshold)
        return Grounding(hits=result.hits if answerable else [], best_similarity=result.best_similarity,
                         min_score=threshold, answerable=answerable)

    async def answer(self, tenant: str, collection: str, question: str, top_k: int | None = None,
                     max_tokens: int | None = None, temperature: float | None = 0.0,
                     stream: bool = False, filters: dict | None = None, min_score: float | None = None) -> RagAnswer:
        """Retrieve, build the numbered-context prompt, and ask the chat engine; when nothing related
        was found, return without asking it (reply None)."""
        if self.chat is None:
            raise RuntimeError("this pipeline has no chat engine")
        grounding = await self.ground(tenant, collection, question, top_k, filters, min_score)
        if not grounding.answerable:
            return RagAnswer(grounding=grounding, reply=None)
        reply = await self.chat.complete(rag_messages(question, grounding.hits),
                                         max_tokens or self.settings.answer_max_tokens, temperature, stream)
        return RagAnswer(grounding=grounding, reply=reply)

    async def augment_chat(self, tenant: str, collection: str, messages: list[dict], top_k: int | None = None,
                           filters: dict | None = None, min_score: float | None = None) -> tuple[list[dict], Grounding]:
        """Chat-with-RAG: the client's messages with the context for its last user turn prepended
        (unchanged when the grounding is not answerable), and the grounding."""
        grounding = await self.ground(tenant, collection, last_user_text(messages), top_k, filters, min_score)
        return (augment_chat(messages, grounding.hits) if grounding.answerable else messages), grounding
