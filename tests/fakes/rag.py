"""Fakes of the RAG pipeline's protocols (rag/retrieval/interfaces.py) for the unit tests."""

import hashlib
import re
import sqlite3

import numpy as np

from rag.documents.chunking import Chunk
from rag.retrieval.search import SearchResult

DIM = 64


def bag_of_words(text: str) -> np.ndarray:
    """A deterministic stand-in for an embedding: hashed word counts (plural 's' folded)."""
    vector = np.zeros(DIM, dtype=np.float32)
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        vector[int(hashlib.md5(word.rstrip("s").encode()).hexdigest(), 16) % DIM] += 1.0
    return vector if vector.any() else np.ones(DIM, dtype=np.float32)


def paragraph_chunks(text: str) -> list[Chunk]:
    """A chunker stand-in: one chunk per blank-line-separated paragraph, with its offsets."""
    chunks = []
    for match in re.finditer(r"\S(?:.*?\S)?(?=\s*(?:\n\s*\n|\Z))", text, flags=re.S):
        chunks.append(Chunk(index=len(chunks), text=match.group(), start=match.start(), end=match.end()))
    return chunks


class FakeEmbedder:
    def __init__(self):
        self.document_calls: list[list[str]] = []
        self.queries: list[str] = []

    async def chunk_documents(self, texts: list[str]) -> list[list[Chunk]]:
        return [paragraph_chunks(text) for text in texts]

    async def embed_documents(self, texts):
        self.document_calls.append(list(texts))
        return np.stack([bag_of_words(t) for t in texts])

    async def embed_query(self, text):
        self.queries.append(text)
        return bag_of_words(text)


class FakeChat:
    def __init__(self):
        self.calls = []

    async def complete(self, messages, max_tokens, temperature, stream):
        self.calls.append(
            {"messages": messages, "max_tokens": max_tokens, "temperature": temperature, "stream": stream}
        )
        return "the answer"


class RecordingIndex:
    def __init__(self, hits=(), best_similarity=0.9):
        self.hits, self.queries, self.upserts = list(hits), [], []
        self.best_similarity = best_similarity

    async def upsert_documents(self, tenant, collection, documents):
        self.upserts.append((tenant, collection, documents))
        return [len(doc[1]) for doc in documents]

    async def search(self, tenant, collection, query):
        self.queries.append((tenant, collection, query))
        return SearchResult(self.hits[: query.top_k], self.best_similarity if self.hits else None)


class ChunkDeleteFails:
    """Wraps the store's connection; the chunk DELETE fails, as a crash between the two statements would."""

    def __init__(self, db):
        self._db = db

    def execute(self, sql, *args):
        if sql.startswith("DELETE FROM chunks"):
            raise sqlite3.OperationalError("simulated crash")
        return self._db.execute(sql, *args)

    def cursor(self):
        return ChunkDeleteFails(self._db.cursor())

    def __getattr__(self, name):
        return getattr(self._db, name)
