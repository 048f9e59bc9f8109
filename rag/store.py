"""Knowledge store: SQLite is the source of truth, FAISS indexes are derived from it.

Writes go to SQLite first (one transaction per document), then to the collection's FAISS
index; on start every index is rebuilt from the vectors stored in SQLite, so a crash between
the two steps loses nothing. The lexical index (FTS5, rag/lexical.py) lives in the same SQLite
database and is written in the same transaction as the chunk rows. Collections are namespaced
per tenant: every call takes the tenant, and another tenant's collection simply does not exist.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from pathlib import Path

import faiss
import numpy as np

from rag.chunking import Chunk
from rag.filters import metadata_condition
from rag.lexical import DEFAULT_TOKENIZER, LexicalIndex
from rag.prompt import RetrievedChunk
from rag.store_schema import create_or_migrate

class CollectionNotFound(LookupError):
    pass


class DocumentNotFound(LookupError):
    pass


class CapacityExceeded(ValueError):
    """An ingest would take the index past the chunks its memory budget was planned for."""


class KnowledgeStore:
    def __init__(self, db_path: str | Path, dim: int, index_kind: str = "flat", hnsw_m: int = 32,
                 hnsw_ef_search: int = 256, capacity_chunks: int | None = None,
                 sqlite_cache_bytes: int | None = None,
                 lexical_tokenizer: str = DEFAULT_TOKENIZER):
        self.dim = dim
        self.index_kind = index_kind
        self.hnsw_m = hnsw_m
        self.hnsw_ef_search = hnsw_ef_search
        # The plan sized the index for this many chunks: past it, memory would outgrow the budget.
        self.capacity_chunks = capacity_chunks
        Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(db_path), check_same_thread=False, isolation_level=None)
        if sqlite_cache_bytes:
            self._db.execute(f"PRAGMA cache_size=-{max(1, int(sqlite_cache_bytes) // 1024)}")  # negative: KiB
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        # An older database gains the columns it lacks (chunk offsets); its old rows keep NULL there.
        self.migrated_columns = create_or_migrate(self._db)
        # FAISS adds/removes are not thread-safe and SQLite's connection is shared: one lock.
        self._lock = threading.RLock()
        self._indexes: dict[tuple[str, str], faiss.Index] = {}
        self.lexical = LexicalIndex(lexical_tokenizer)
        self._rebuild_all()

    # ---- index maintenance -------------------------------------------------------------
    def _new_index(self) -> faiss.Index:
        if self.index_kind == "hnsw":
            inner = faiss.IndexHNSWFlat(self.dim, self.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            inner.hnsw.efSearch = self.hnsw_ef_search
        else:
            inner = faiss.IndexFlatIP(self.dim)
        return faiss.IndexIDMap2(inner)

    def _rebuild(self, tenant: str, collection: str) -> None:
        rows = self._db.execute(
            "SELECT id, vector FROM chunks WHERE tenant=? AND collection=? ORDER BY id", (tenant, collection)
        ).fetchall()
        index = self._new_index()
        if rows:
            ids = np.array([r[0] for r in rows], dtype=np.int64)
            vectors = np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(rows), self.dim)
            index.add_with_ids(vectors, ids)
        self._indexes[(tenant, collection)] = index

    def _rebuild_all(self) -> None:
        with self._lock:
            collections = self._db.execute("SELECT tenant, name FROM collections").fetchall()
            for tenant, name in collections:
                self._rebuild(tenant, name)
            # A database from before the lexical index (or another tokenizer) gets it from its chunk rows.
            self.lexical.migrate(self._db, collections)

    def _vectors(self, vectors: np.ndarray | list) -> np.ndarray:
        array = np.array(vectors, dtype=np.float32, order="C")  # a copy: normalize_L2 works in place
        if array.ndim != 2 or array.shape[1] != self.dim:
            raise ValueError(f"expected vectors of dimension {self.dim}, got shape {array.shape}")
        faiss.normalize_L2(array)  # inner product of unit vectors = cosine similarity
        return array

    # ---- writes ------------------------------------------------------------------------
    def upsert_document(
        self, tenant: str, collection: str, doc_id: str, chunks: list[str], vectors, metadata: dict | None = None,
        chars: int = 0,
    ) -> int:
        """Store (or replace) a document's chunks; returns the chunk count."""
        return self.upsert_documents(tenant, collection, [(doc_id, chunks, vectors, metadata, chars)])[0]

    def upsert_documents(self, tenant: str, collection: str, documents: list[tuple]) -> list[int]:
        """Store (or replace) several documents in ONE transaction: all of them or none.

        Each document is (doc_id, chunks, vectors, metadata, chars); a chunk is a rag.chunking.Chunk
        (its offsets are stored) or plain text (stored without offsets). Returns each one's chunk count."""
        arrays = []
        for doc_id, chunks, vectors, _, _ in documents:
            array = self._vectors(vectors) if chunks else np.zeros((0, self.dim), dtype=np.float32)
            if len(array) != len(chunks):
                raise ValueError(f"document {doc_id!r}: {len(chunks)} chunks but {len(array)} vectors")
            arrays.append(array)
        now = time.time()
        with self._lock:
            self._check_capacity(tenant, collection, documents)
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            changes = []
            try:
                cur.execute("INSERT OR IGNORE INTO collections VALUES (?, ?, ?)", (tenant, collection, now))
                self.lexical.create(cur, tenant, collection)
                for (doc_id, chunks, _, metadata, chars), array in zip(documents, arrays):
                    old_ids = [r[0] for r in cur.execute(
                        "SELECT id FROM chunks WHERE tenant=? AND collection=? AND doc_id=?", (tenant, collection, doc_id))]
                    self.lexical.remove(cur, tenant, collection, old_ids)
                    cur.execute("DELETE FROM chunks WHERE tenant=? AND collection=? AND doc_id=?",
                                (tenant, collection, doc_id))
                    new_ids, texts = [], []
                    for i, (chunk, vector) in enumerate(zip(chunks, array)):
                        text, start, end = _text_and_offsets(chunk)
                        cur.execute(
                            "INSERT INTO chunks (tenant, collection, doc_id, chunk_index, text, vector, start_char, "
                            "end_char) VALUES (?,?,?,?,?,?,?,?)",
                            (tenant, collection, doc_id, i, text, vector.tobytes(), start, end),
                        )
                        new_ids.append(cur.lastrowid)
                        texts.append(text)
                    self.lexical.add(cur, tenant, collection, list(zip(new_ids, texts)))
                    cur.execute(
                        "INSERT OR REPLACE INTO documents VALUES (?,?,?,?,?,?,?)",
                        (tenant, collection, doc_id, json.dumps(metadata or {}, allow_nan=False), chars, len(chunks), now),
                    )
                    changes.append((old_ids, np.array(new_ids, dtype=np.int64), array))
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
            key = (tenant, collection)
            if key not in self._indexes:
                self._indexes[key] = self._new_index()
            for old_ids, new_ids, array in changes:
                self._apply(key, old_ids, new_ids, array)
        return [len(doc[1]) for doc in documents]

    def _check_capacity(self, tenant: str, collection: str, documents: list[tuple]) -> None:
        if self.capacity_chunks is None:
            return
        held = sum(index.ntotal for index in self._indexes.values())
        replaced = sum(r[0] for doc in documents for r in self._db.execute(
            "SELECT count(*) FROM chunks WHERE tenant=? AND collection=? AND doc_id=?", (tenant, collection, doc[0])))
        adding = sum(len(doc[1]) for doc in documents)
        if held - replaced + adding > self.capacity_chunks:
            raise CapacityExceeded(
                f"the knowledge store holds {held:,} chunks of the {self.capacity_chunks:,} its memory is planned "
                f"for (retriever.capacity_chunks); this ingest adds {adding:,}. Delete documents or re-plan with a "
                "larger capacity")

    def _apply(self, key: tuple[str, str], removed: list[int], added_ids: np.ndarray, added: np.ndarray) -> None:
        index = self._indexes[key]
        if removed and self.index_kind == "hnsw":
            self._rebuild(*key)  # HNSW cannot remove ids: rebuild from SQLite, which already has the new rows
            return
        if removed:
            index.remove_ids(np.array(removed, dtype=np.int64))
        if len(added_ids):
            index.add_with_ids(added, added_ids)

    def _in_transaction(self, statements: list[tuple[str, tuple]], then=None) -> list[int]:
        """Run the statements, then `then(cursor)` if given, as one SQLite transaction; returns each
        statement's rowcount."""
        cur = self._db.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            counts = [cur.execute(sql, params).rowcount for sql, params in statements]
            if then is not None:
                then(cur)
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        return counts

    def delete_document(self, tenant: str, collection: str, doc_id: str) -> None:
        key = (tenant, collection, doc_id)
        with self._lock:
            self._require_collection(tenant, collection)
            ids = [r[0] for r in self._db.execute(
                "SELECT id FROM chunks WHERE tenant=? AND collection=? AND doc_id=?", key)]
            deleted, _, _ = self._in_transaction([
                ("DELETE FROM documents WHERE tenant=? AND collection=? AND doc_id=?", key),
                (self.lexical.remove_document_sql(tenant, collection), key),  # while the chunk rows still say which
                ("DELETE FROM chunks WHERE tenant=? AND collection=? AND doc_id=?", key),
            ])
            if not deleted:
                raise DocumentNotFound(f"document {doc_id!r} not found in collection {collection!r}")
            self._apply((tenant, collection), ids, np.zeros(0, dtype=np.int64), np.zeros((0, self.dim), np.float32))

    def delete_collection(self, tenant: str, collection: str) -> None:
        with self._lock:
            self._require_collection(tenant, collection)
            self._in_transaction([
                (f"DELETE FROM {table} WHERE tenant=? AND {column}=?", (tenant, collection))
                for table, column in (("chunks", "collection"), ("documents", "collection"), ("collections", "name"))
            ], then=lambda cur: self.lexical.drop(cur, tenant, collection))
            self._indexes.pop((tenant, collection), None)

    def delete_tenant(self, tenant: str) -> int:
        """Remove every collection of a tenant (the tenant was deleted); returns how many."""
        with self._lock:
            names = [r[0] for r in self._db.execute("SELECT name FROM collections WHERE tenant=?", (tenant,))]
            self._in_transaction([(f"DELETE FROM {table} WHERE tenant=?", (tenant,))
                                  for table in ("chunks", "documents", "collections")],
                                 then=lambda cur: [self.lexical.drop(cur, tenant, name) for name in names])
            for name in names:
                self._indexes.pop((tenant, name), None)
        return len(names)

    # ---- reads -------------------------------------------------------------------------
    def _require_collection(self, tenant: str, collection: str) -> None:
        if not self._db.execute(
            "SELECT 1 FROM collections WHERE tenant=? AND name=?", (tenant, collection)
        ).fetchone():
            raise CollectionNotFound(f"collection {collection!r} not found")

    def list_collections(self, tenant: str) -> list[dict]:
        with self._lock:
            rows = self._list_rows(tenant)
        return [{"name": n, "created_at": t, "documents": d, "chunks": c} for n, t, d, c in rows]

    def _list_rows(self, tenant: str) -> list[tuple]:
        return self._db.execute(
            "SELECT c.name, c.created_at, COUNT(d.doc_id), COALESCE(SUM(d.chunk_count), 0) FROM collections c "
            "LEFT JOIN documents d ON d.tenant=c.tenant AND d.collection=c.name WHERE c.tenant=? "
            "GROUP BY c.name ORDER BY c.name", (tenant,)
        ).fetchall()

    def list_all_collections(self) -> list[dict]:
        """Every tenant's collections with their counts: the operator's view (the dashboard)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT c.tenant, c.name, COUNT(d.doc_id), COALESCE(SUM(d.chunk_count), 0) FROM collections c "
                "LEFT JOIN documents d ON d.tenant=c.tenant AND d.collection=c.name "
                "GROUP BY c.tenant, c.name ORDER BY c.tenant, c.name").fetchall()
        return [{"tenant": t, "name": n, "documents": d, "chunks": c} for t, n, d, c in rows]

    def collection_info(self, tenant: str, collection: str) -> dict:
        with self._lock:
            self._require_collection(tenant, collection)
            docs = self._db.execute(
                "SELECT doc_id, chunk_count, chars, metadata, updated_at FROM documents "
                "WHERE tenant=? AND collection=? ORDER BY doc_id", (tenant, collection)
            ).fetchall()
            indexed = self._indexes[(tenant, collection)].ntotal
        return {
            "name": collection,
            "documents": [
                {"id": d, "chunks": c, "chars": ch, "metadata": json.loads(m), "updated_at": u} for d, c, ch, m, u in docs
            ],
            "document_count": len(docs),
            "chunk_count": sum(d[1] for d in docs),
            "indexed_vectors": indexed,
            "index": self.index_kind,
        }

    def search(self, tenant: str, collection: str, vector, top_k: int,
               filters: dict | None = None) -> list[RetrievedChunk]:
        """Dense search: cosine similarity of the query vector with every chunk's, best first. With
        filters, only chunks of documents whose metadata matches are searched (top_k of those)."""
        query = self._vectors([vector])
        with self._lock:
            self._require_collection(tenant, collection)
            index = self._indexes[(tenant, collection)]
            if index.ntotal == 0:
                return []
            if filters:
                return self._chunks(self._search_among(index, query, self._matching_ids(tenant, collection, filters),
                                                       top_k))
            scores, ids = index.search(query, min(top_k, index.ntotal))
            return self._chunks([(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0])

    def _matching_ids(self, tenant: str, collection: str, filters: dict) -> np.ndarray:
        """The rowids of the collection's chunks whose document's metadata matches the filters."""
        sql, params = self._matching_ids_sql(filters)
        rows = self._db.execute(sql, (tenant, collection, *params)).fetchall()
        return np.array([r[0] for r in rows], dtype=np.int64)

    @staticmethod
    def _matching_ids_sql(filters: dict) -> tuple[str, list]:
        """SELECT of matching chunk rowids, taking (tenant, collection, *params)."""
        condition, params = metadata_condition(filters, "d.metadata")
        return ("SELECT c.id FROM chunks c JOIN documents d ON d.tenant=c.tenant AND d.collection=c.collection "
                f"AND d.doc_id=c.doc_id WHERE c.tenant=? AND c.collection=? AND {condition}"), params

    def _search_among(self, index: faiss.Index, query: np.ndarray, allowed: np.ndarray,
                      top_k: int) -> list[tuple[int, float]]:
        """The top_k of the allowed rowids, searched inside FAISS (an ID selector), so a filter that
        matches few chunks still gets top_k of them rather than what is left of a fixed candidate list."""
        if not len(allowed):
            return []
        wanted = min(top_k, len(allowed))
        selector = faiss.IDSelectorBatch(allowed)
        params = (faiss.SearchParametersHNSW(sel=selector, efSearch=max(self.hnsw_ef_search, wanted))
                  if self.index_kind == "hnsw" else faiss.SearchParameters(sel=selector))
        scores, ids = index.search(query, wanted, params=params)
        hits = [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]
        if len(hits) < wanted:  # HNSW's graph walk can miss sparse matches: score them all exactly
            vectors = np.vstack([index.reconstruct(int(i)) for i in allowed])
            scores = vectors @ query[0]
            order = np.argsort(-scores, kind="stable")[:wanted]
            hits = [(int(allowed[i]), float(scores[i])) for i in order]
        return hits

    def search_lexical(self, tenant: str, collection: str, text: str, top_k: int,
                       filters: dict | None = None) -> list[RetrievedChunk]:
        """Lexical search: FTS5 bm25 over the chunk texts (score = -bm25, higher is better), best first;
        with filters, over the chunks of matching documents only (inside the FTS5 query)."""
        with self._lock:
            self._require_collection(tenant, collection)
            only = None
            if filters:
                sql, params = self._matching_ids_sql(filters)
                only = (f"rowid IN ({sql})", [tenant, collection, *params])
            return self._chunks(self.lexical.search(self._db, tenant, collection, text, top_k, only=only))

    def _chunks(self, hits: list[tuple[int, float]]) -> list[RetrievedChunk]:
        """The chunk rows of (rowid, score) hits, in the hits' order; call with the lock held."""
        if not hits:
            return []
        marks = ",".join("?" * len(hits))
        rows = {
            r[0]: r[1:]
            for r in self._db.execute(
                f"SELECT c.id, c.doc_id, c.chunk_index, c.text, d.metadata, c.start_char, c.end_char FROM chunks c "
                f"JOIN documents d ON d.tenant=c.tenant AND d.collection=c.collection AND d.doc_id=c.doc_id "
                f"WHERE c.id IN ({marks})",
                [i for i, _ in hits],
            )
        }
        found = []
        for i, score in hits:
            if i in rows:  # a hit whose row a concurrent delete removed is skipped
                doc_id, index, text, metadata, start, end = rows[i]
                found.append(RetrievedChunk(document_id=doc_id, chunk_id=f"{doc_id}#{index}", score=score, text=text,
                                            metadata=json.loads(metadata), start=start, end=end))
        return found

    def stats(self) -> dict:
        with self._lock:
            return {
                "collections": len(self._indexes),
                "vectors": sum(index.ntotal for index in self._indexes.values()),
                "index_bytes_estimate": sum(index.ntotal for index in self._indexes.values()) * self.dim * 4,
            }

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _text_and_offsets(chunk: Chunk | str) -> tuple[str, int | None, int | None]:
    if isinstance(chunk, str):
        return chunk, None, None
    return chunk.text, chunk.start, chunk.end
