"""The RAG pipeline as a plain service: ingest documents, retrieve for a question, answer it.

No transport here: the embedder, the index and the chat engine come in through the protocols of
rag/retrieval/interfaces.py, so the gateway adapts HTTP and Ray to it and the unit tests drive it with fakes.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Generic, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from planner.profile import RagSpec
from rag.documents.chunking import Chunk, document_title, with_title
from rag.documents.extract import PLAIN, Extracted, extract, normalize_content_type
from rag.documents.locations import LOCATIONS_KEY, section_of
from rag.retrieval.filters import InvalidFilter, normalize_filters
from rag.retrieval.interfaces import ChatEngine, Embedder, KnowledgeIndex, Reply
from rag.retrieval.no_answer import is_answerable
from rag.retrieval.prompt import (
    RetrievedChunk,
    augment_chat,
    citations,
    estimate_tokens,
    fit_context,
    last_user_text,
    rag_messages,
)
from rag.retrieval.search import RetrievalMode, SearchQuery, SearchResult


class InvalidQuery(ValueError):
    """The question or its options cannot be served; the message says why (a client error)."""

    status = 400


class QuestionTooLong(InvalidQuery):
    """The question is over rag.max_question_chars: no request could carry it (413)."""

    status = 413


class PipelineSettings(RagSpec):
    """The profile's `rag` section as the pipeline reads it: one definition (planner/profile.py RagSpec),
    given the gateway's settings, which carry more than the RAG fields."""

    model_config = ConfigDict(extra="ignore", frozen=True)


@dataclass(frozen=True)
class DocumentInput:
    id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    content_type: str = PLAIN  # how `text` is written (rag/documents/extract.py CONTENT_TYPES)
    data: bytes | None = None  # the file's bytes instead of text (PDF, DOCX, PPTX; HTML as its file declares)


@dataclass
class IngestTimings:
    """Wall seconds an ingest spent in each part, as the caller saw them (the gateway reports them in a
    Server-Timing header and its log line): where the time of an ingest goes."""

    extract: float = 0.0
    chunk: float = 0.0
    embed: float = 0.0  # the embedder calls as awaited, of which:
    embedder_busy: float = 0.0  # inside the embedder (its forward passes and their bookkeeping), as it reports
    embedder_cleanup: float = 0.0  # of that, its heap trim and device-cache release after each call
    charge: float = 0.0  # recording the tenant's usage after each call
    store: float = 0.0

    def server_timing(self) -> str:
        """The Server-Timing header's value (milliseconds), which browsers' and clients' tools show."""
        return ", ".join(f"{name};dur={seconds * 1000:.1f}" for name, seconds in vars(self).items())

    @contextmanager
    def part(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, name, getattr(self, name) + time.perf_counter() - started)


# Text out of one document (rag/documents/extract.py; the gateway runs it in a capped worker process).
Extractor = Callable[[DocumentInput], Awaitable[Extracted]]


async def extract_here(doc: DocumentInput) -> Extracted:
    """In-process extraction, off the event loop (tools and tests; the gateway uses its worker pool)."""
    return await asyncio.to_thread(extract, doc.data if doc.data is not None else doc.text, doc.content_type)


class IngestProgress(BaseModel):
    """Where an ingest stands; reported after chunking, after each embedder call, before the store
    step (the last point where an ingest job can still be cancelled) and once stored."""

    stage: Literal["chunked", "embedding", "storing", "stored"]
    documents: int = Field(description="Documents in the ingest.")
    chunks: int = Field(description="Chunks they were cut into (known once chunked).")
    chunks_embedded: int = Field(description="Chunks embedded so far.")


ProgressCallback = Callable[[IngestProgress], Awaitable[None] | None]
# Told every text an ingest is about to embed, once they are chunked and before the first embedder call: the
# gateway reserves their tokens against the tenant's TPM there, and refuses the ingest (raising) if it cannot.
BeforeEmbedding = Callable[[list[str]], Awaitable[None]]


async def _report(on_progress: ProgressCallback | None, progress: IngestProgress) -> None:
    if on_progress is not None and (pending := on_progress(progress)) is not None:
        await pending


@dataclass(frozen=True)
class Grounding:
    """What retrieval found for a question, and whether it is enough to answer from. When it is not,
    there are no hits to cite: the caller answers rag.retrieval.no_answer.NO_ANSWER without the model."""

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


def needs_extraction(doc: DocumentInput) -> bool:
    return doc.data is not None or normalize_content_type(doc.content_type) != PLAIN


def as_plain_text(doc: DocumentInput, extracted: Extracted) -> DocumentInput:
    """The document as the text a reader sees; a title the format names (an HTML <title>, a file's
    metadata title) becomes its metadata title unless the client gave one, and the page/slide/section
    map (rag/documents/locations.py) travels in its metadata for citations."""
    metadata = doc.metadata
    if extracted.title and not metadata.get("title"):
        metadata = {**metadata, "title": extracted.title}
    if extracted.locations:
        metadata = {**metadata, LOCATIONS_KEY: extracted.locations}
    return DocumentInput(id=doc.id, text=extracted.text, metadata=metadata, content_type=PLAIN)


class RagPipeline:
    def __init__(
        self,
        embedder: Embedder,
        index: KnowledgeIndex,
        settings: PipelineSettings,
        chat: ChatEngine | None = None,
        extractor: Extractor = extract_here,
        count_tokens: Callable[[str], int] = estimate_tokens,
    ):
        self.extractor = extractor
        self.count_tokens = count_tokens  # the chat model's tokenizer, for the context budget
        self.embedder = embedder
        self.index = index
        self.settings = settings
        self.chat = chat

    # ---- ingest ----------------------------------------------------------------------------
    async def ingest(
        self,
        tenant: str,
        collection: str,
        documents: list[DocumentInput],
        on_progress: ProgressCallback | None = None,
        before_embedding: BeforeEmbedding | None = None,
        timings: IngestTimings | None = None,
    ) -> list[int]:
        """Extract, chunk and embed every document, then store them all in one transaction (all or
        none). Returns each document's chunk count; `on_progress` hears how far it got,
        `before_embedding` gets every text to embed before the first is (it may refuse by raising), and
        `timings` adds up the seconds of each part."""
        timings = timings if timings is not None else IngestTimings()
        with timings.part("extract"):
            documents = list(await asyncio.gather(*(self._plain(doc) for doc in documents)))
        with timings.part("chunk"):
            chunked = await self.embedder.chunk_documents([doc.text for doc in documents])
        texts = [text for doc, chunks in zip(documents, chunked) for text in self.texts_to_embed(doc, chunks)]
        progress = IngestProgress(stage="chunked", documents=len(documents), chunks=len(texts), chunks_embedded=0)
        await _report(on_progress, progress)
        if before_embedding is not None:
            await before_embedding(texts)
        with timings.part("embed"):
            vectors = await self._embed(texts, progress, on_progress)
        batch, start = [], 0
        for doc, chunks in zip(documents, chunked):
            batch.append((doc.id, chunks, vectors[start : start + len(chunks)], doc.metadata, len(doc.text)))
            start += len(chunks)
        await _report(on_progress, progress.model_copy(update={"stage": "storing", "chunks_embedded": len(texts)}))
        with timings.part("store"):
            counts = await self.index.upsert_documents(tenant, collection, batch)
        await _report(on_progress, progress.model_copy(update={"stage": "stored", "chunks_embedded": len(texts)}))
        return counts

    async def _plain(self, doc: DocumentInput) -> DocumentInput:
        return as_plain_text(doc, await self.extractor(doc)) if needs_extraction(doc) else doc

    def texts_to_embed(self, doc: DocumentInput, chunks: list[Chunk]) -> list[str]:
        """A chunk deep in a long document rarely names what it belongs to; with the title (and the
        section's headings) in front its vector does (the stored text, which citations and prompts
        show, stays the chunk)."""
        title = document_title(doc.text, doc.metadata) if self.settings.embed_title else None
        locations = doc.metadata.get(LOCATIONS_KEY) if self.settings.embed_section else None
        return [with_title(title, with_title(section_of(locations, chunk.start), chunk.text)) for chunk in chunks]

    async def _embed(
        self, texts: list[str], progress: IngestProgress, on_progress: ProgressCallback | None
    ) -> np.ndarray:
        """Embedded in bounded calls, so one large ingest is not one huge message to the embedder and
        its progress can be reported between them."""
        step = self.settings.embed_batch_chunks
        parts = []
        for i in range(0, len(texts), step):
            parts.append(np.asarray(await self.embedder.embed_documents(texts[i : i + step]), dtype=np.float32))
            progress = progress.model_copy(update={"stage": "embedding", "chunks_embedded": i + len(parts[-1])})
            await _report(on_progress, progress)
        return np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float32)

    # ---- query -----------------------------------------------------------------------------
    def _top_k(self, top_k: int | None) -> int:
        top_k = top_k or self.settings.default_top_k
        if top_k > self.settings.max_top_k:
            raise InvalidQuery(f"top_k {top_k} is above the limit of {self.settings.max_top_k}")
        return top_k

    async def search(
        self,
        tenant: str,
        collection: str,
        question: str,
        top_k: int | None = None,
        mode: RetrievalMode | None = None,
        filters: dict | None = None,
    ) -> SearchResult:
        """The question's top_k chunks among those of documents matching `filters`, best first."""
        top_k = self._top_k(top_k)
        if not question.strip():
            raise InvalidQuery("no question: the question (in chat, the last user message) is empty")
        if len(question) > self.settings.max_question_chars:  # lexical search and the embedder read all of it
            raise QuestionTooLong(
                f"the question (in chat, the last user message) is {len(question)} characters; "
                f"the limit is {self.settings.max_question_chars} (rag.max_question_chars)"
            )
        try:
            filters = normalize_filters(filters) or None
        except InvalidFilter as exc:
            raise InvalidQuery(str(exc)) from None
        mode = mode or self.settings.retrieval
        vector = None if mode == "lexical" else await self.embedder.embed_query(question)
        query = SearchQuery(text=question, top_k=top_k, mode=mode, vector=vector, filters=filters)
        return await self.index.search(tenant, collection, query)

    async def retrieve(
        self,
        tenant: str,
        collection: str,
        question: str,
        top_k: int | None = None,
        mode: RetrievalMode | None = None,
        filters: dict | None = None,
    ) -> list[RetrievedChunk]:
        return (await self.search(tenant, collection, question, top_k, mode, filters)).hits

    async def ground(
        self,
        tenant: str,
        collection: str,
        question: str,
        top_k: int | None = None,
        filters: dict | None = None,
        min_score: float | None = None,
        context_tokens: int | None = None,
    ) -> Grounding:
        """Retrieve, then decide whether the passages are related enough to answer from; the passages
        kept are those that fit the context budget (rag.context_tokens, or the request's smaller one)."""
        threshold = self.settings.min_score if min_score is None else min_score
        budget = self._context_tokens(context_tokens)
        result = await self.search(tenant, collection, question, top_k, filters=filters)
        answerable = is_answerable(result, threshold)
        hits = fit_context(result.hits, budget, self.count_tokens) if answerable else []
        return Grounding(hits=hits, best_similarity=result.best_similarity, min_score=threshold, answerable=answerable)

    def _context_tokens(self, asked: int | None) -> int | None:
        limit = self.settings.context_tokens
        if asked is None:
            return limit
        if limit is not None and asked > limit:
            raise InvalidQuery(f"context_tokens {asked} is above the limit of {limit} (rag.context_tokens)")
        return asked

    async def answer(
        self,
        tenant: str,
        collection: str,
        question: str,
        top_k: int | None = None,
        max_tokens: int | None = None,
        temperature: float | None = 0.0,
        stream: bool = False,
        filters: dict | None = None,
        min_score: float | None = None,
        context_tokens: int | None = None,
    ) -> RagAnswer:
        """Retrieve, build the numbered-context prompt, and ask the chat engine; when nothing related
        was found, return without asking it (reply None)."""
        if self.chat is None:
            raise RuntimeError("this pipeline has no chat engine")
        grounding = await self.ground(tenant, collection, question, top_k, filters, min_score, context_tokens)
        if not grounding.answerable:
            return RagAnswer(grounding=grounding, reply=None)
        reply = await self.chat.complete(
            rag_messages(question, grounding.hits), max_tokens or self.settings.answer_max_tokens, temperature, stream
        )
        return RagAnswer(grounding=grounding, reply=reply)

    async def augment_chat(
        self,
        tenant: str,
        collection: str,
        messages: list[dict],
        top_k: int | None = None,
        filters: dict | None = None,
        min_score: float | None = None,
        context_tokens: int | None = None,
    ) -> tuple[list[dict], Grounding]:
        """Chat-with-RAG: the client's messages with the context for its last user turn prepended
        (unchanged when the grounding is not answerable), and the grounding."""
        grounding = await self.ground(
            tenant, collection, last_user_text(messages), top_k, filters, min_score, context_tokens
        )
        return (augment_chat(messages, grounding.hits) if grounding.answerable else messages), grounding
