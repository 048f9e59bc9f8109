"""Lexical baselines and variants beside the stack's retrieval, for bench/bench_rag_quality.py.

- bm25-pages: BM25 over whole pages, one FTS5 row per document (the same tokenizer, rag.store.lexical's
  DEFAULT_TOKENIZER, and the same question-to-MATCH rule, rag.retrieval.lexical_query.fts5_match, as the
  stack's chunk-level lexical index), in an in-memory SQLite database. The baseline a retriever
  of chunks has to beat: no chunking, no embedder.
- title-boosted lexical: an FTS5 table over the same chunks with two columns, the chunk's document
  title and the chunk text, ranked by bm25 with the title column weighted (FTS5's per-column bm25
  weights); alone, and fused with the store's dense candidates through rag.retrieval.search.fuse. The same
  with whole pages (bm25-pages with a title column).
"""

from __future__ import annotations

import sqlite3
import statistics
import time

from bench.harness.ranking import rank_of
from rag.retrieval.lexical_query import fts5_match
from rag.retrieval.prompt import RetrievedChunk
from rag.store.lexical import DEFAULT_TOKENIZER

TITLE_WEIGHTS = (1.0, 2.0, 5.0)


class FieldIndex:
    """FTS5 over (title, text) rows; search() ranks by bm25 with the given title weight."""

    def __init__(self, rows: list[tuple[str, str, str, str]]):
        """rows: (document_id, chunk_id, title, text)."""
        self.db = sqlite3.connect(":memory:")
        self.db.execute(f"CREATE VIRTUAL TABLE t USING fts5(title, text, tokenize='{DEFAULT_TOKENIZER}')")
        self.db.executemany(
            "INSERT INTO t (rowid, title, text) VALUES (?, ?, ?)",
            [(i, title, text) for i, (_, _, title, text) in enumerate(rows)],
        )
        self.rows = rows

    def search(self, question: str, limit: int, title_weight: float | None = None) -> list[RetrievedChunk]:
        """Best first, score = -bm25. title_weight None: the text column only (the title not searched)."""
        match = fts5_match(question)
        if match is None:
            return []
        if title_weight is None:
            match, rank = f"{{text}} : ({match})", "bm25(t, 0.0, 1.0)"
        else:
            rank = f"bm25(t, {float(title_weight)}, 1.0)"
        hits = self.db.execute(
            f"SELECT rowid, {rank} FROM t WHERE t MATCH ? ORDER BY {rank} LIMIT ?", (match, limit)
        ).fetchall()
        return [
            RetrievedChunk(document_id=self.rows[i][0], chunk_id=self.rows[i][1], score=-score, text="")
            for i, score in hits
        ]

    def close(self) -> None:
        self.db.close()


def page_index(corpus) -> FieldIndex:
    """One row per document: its whole text (and its title for the title-boosted variant)."""
    return FieldIndex([(doc.id, doc.id, doc.metadata.get("title") or "", doc.text) for doc in corpus])


def chunk_index(corpus, chunker) -> FieldIndex:
    """One row per chunk, cut by the same chunker as the ingest; chunk ids as the store names them."""
    rows = []
    for doc in corpus:
        title = doc.metadata.get("title") or ""
        rows += [
            (doc.id, f"{doc.id}#{i}", title, chunk.text if hasattr(chunk, "text") else chunk)
            for i, chunk in enumerate(chunker(doc.text))
        ]
    return FieldIndex(rows)


def evaluate_pages(pages: FieldIndex, questions: list[dict], depth: int, metrics) -> dict:
    """bm25-pages in the shape of bench_rag_quality.evaluate (ranks of documents, top `depth` pages)."""
    ranks, seconds = [], []
    for q in questions:
        start = time.perf_counter()
        hits = pages.search(q["question"], depth)
        seconds.append(time.perf_counter() - start)
        ranks.append(rank_of(hits, set(q["documents"])))
    by_kind = {
        kind: metrics([r for r, q in zip(ranks, questions) if q["kind"] == kind])
        for kind in sorted({q["kind"] for q in questions})
    }
    return {
        **metrics(ranks),
        "query_p50_ms": round(statistics.median(seconds) * 1e3, 2),
        "by_kind": by_kind,
        "missed_top5": [q["id"] for r, q in zip(ranks, questions) if r is None or r > 5],
    }


def compare_title_boosts(
    pages: FieldIndex,
    chunks: FieldIndex,
    dense: list[list[RetrievedChunk]],
    questions: list[dict],
    depth: int,
    candidates: int,
    fusion,
    fuse,
    metrics,
) -> dict:
    """Lexical with the title as a weighted field, per weight: chunks alone, chunks fused with the
    given dense candidates (one list per question), whole pages. 'no title' = the text column only."""
    out = {}
    for weight in (None, *TITLE_WEIGHTS):
        label = "no title" if weight is None else f"title x{weight:g}"
        lexical = [chunks.search(q["question"], candidates, weight) for q in questions]
        for name, ranked in (
            ("lexical", [lex[:depth] for lex in lexical]),
            ("hybrid", [fuse(d, lex, depth, fusion) for d, lex in zip(dense, lexical)]),
            ("bm25-pages", [pages.search(q["question"], depth, weight) for q in questions]),
        ):
            ranks = [rank_of(hits, set(q["documents"])) for hits, q in zip(ranked, questions)]
            by_kind = {
                kind: metrics([r for r, q in zip(ranks, questions) if q["kind"] == kind])["recall@5"]
                for kind in sorted({q["kind"] for q in questions})
            }
            out[f"{name}, {label}"] = {**metrics(ranks), "recall@5_by_kind": by_kind}
    return out
