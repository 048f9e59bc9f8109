"""In-process implementations of the pipeline's protocols, over the real embedder and store.

For the benchmark and tools that run the pipeline without Ray; the stack itself uses
gateway/rag_adapters.py.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from rag.documents.chunking import Chunk
from rag.retrieval.embedding import SentenceTransformerEmbedder
from rag.retrieval.search import FusionSettings, SearchQuery, SearchResult, retrieve
from rag.store.knowledge_store import KnowledgeStore


class LocalEmbedder:
    """The embedder's vectors; `chunker` replaces its own chunking (to compare chunkings): it returns
    Chunks, or plain texts (then stored without offsets)."""

    def __init__(
        self, embedder: SentenceTransformerEmbedder, chunker: Callable[[str], list[Chunk] | list[str]] | None = None
    ):
        self._embedder = embedder
        self._chunk = chunker
        self.tokens = 0  # tokens embedded for documents, as the gateway charges them

    async def chunk_documents(self, texts: list[str]) -> list[list[Chunk]]:
        if self._chunk is None:
            return self._embedder.chunk_documents(texts)
        return [
            [c if isinstance(c, Chunk) else Chunk(index=i, text=c) for i, c in enumerate(self._chunk(text))]
            for text in texts
        ]

    async def embed_documents(self, texts: list[str]) -> np.ndarray:
        result = self._embedder.embed(texts)
        self.tokens += result["tokens"]
        return result["vectors"]

    async def embed_query(self, text: str) -> np.ndarray:
        return self._embedder.embed_query(text)


class LocalIndex:
    def __init__(self, store: KnowledgeStore, fusion: FusionSettings = FusionSettings()):
        self.store = store
        self.fusion = fusion

    async def upsert_documents(self, tenant: str, collection: str, documents: list[tuple]) -> list[int]:
        return self.store.upsert_documents(tenant, collection, documents)

    async def search(self, tenant: str, collection: str, query: SearchQuery) -> SearchResult:
        return retrieve(self.store, tenant, collection, query, self.fusion)
