"""What the RAG pipeline needs from the outside world, as small protocols.

The gateway implements them over Ray handles (gateway/rag_adapters.py), the benchmark
in-process (rag/local.py), the unit tests with fakes. Everything is async because the gateway's
implementations are remote calls.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

import numpy as np

from rag.documents.chunking import Chunk
from rag.retrieval.search import SearchQuery, SearchResult

Reply = TypeVar("Reply", covariant=True)


class Embedder(Protocol):
    async def chunk_documents(self, texts: list[str]) -> list[list[Chunk]]:
        """Each document's chunks, each small enough for the model to read whole, with their offsets (one
        call for all of an ingest's documents: they are tokenized together, over the embedder's threads)."""

    async def embed_documents(self, texts: list[str]) -> np.ndarray:
        """One vector per chunk text (rows), for storing."""

    async def embed_query(self, text: str) -> np.ndarray:
        """The vector of a question, for searching."""


class KnowledgeIndex(Protocol):
    async def upsert_documents(self, tenant: str, collection: str, documents: list[tuple]) -> list[int]:
        """Store (or replace) (doc_id, chunks, vectors, metadata, chars) documents all-or-none; chunk counts."""

    async def search(self, tenant: str, collection: str, query: SearchQuery) -> SearchResult:
        """The query's top_k chunks, best first, and the best similarity (rag.retrieval.search.retrieve)."""


class ChatEngine(Protocol[Reply]):
    async def complete(self, messages: list[dict], max_tokens: int, temperature: float | None, stream: bool) -> Reply:
        """The model's reply to the messages, in whatever form the caller's transport needs."""
