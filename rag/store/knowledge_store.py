"""Knowledge store: SQLite is the source of truth, FAISS indexes are derived from it.

Writes go to SQLite first (one transaction per batch), then to the collection's FAISS index
(rag/store/vector_index.py). The indexes are saved to files beside the database (on close, and every
retriever.index_save_interval_s while they have changes); on start each file is loaded and checked
against SQLite's chunk ids, which are the truth: rows the file lacks are added from SQLite, ids
SQLite no longer has are dropped, and a missing, unreadable or other-kind file is rebuilt from
SQLite. A crash between the two steps therefore loses nothing. The lexical index (FTS5, rag/store/lexical.py) lives in the same SQLite
database and is written in the same transaction as the chunk rows. Collections are namespaced
per tenant: every call takes the tenant, and another tenant's collection simply does not exist.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import faiss
import numpy as np

from rag.documents.chunking import Chunk
from rag.documents.locations import LOCATIONS_KEY
from rag.retrieval.prompt import RetrievedChunk
from rag.store.capacity import CapacityExceeded, Quotas, check_capacity
from rag.store.lexical import DEFAULT_TOKENIZER, LexicalIndex
from rag.store.metadata_index import matching_chunks_sql, write_metadata
from rag.store.store_schema import check_embedder, create_or_migrate
from rag.store.vector_index import CollectionIndex
from system.sqlite import connect, transaction

__all__ = ["CapacityExceeded", "CollectionNotFound", "DocumentNotFound", "KnowledgeStore"]


class CollectionNotFound(LookupError):
    pass


class DocumentNotFound(LookupError):
    pass


class KnowledgeStore:
    def __init__(
        self,
        db_path: str | Path,
        dim: int,
        index_kind: str = "flat",
        hnsw_m: int = 32,
        hnsw_ef_search: int = 256,
        capacity_chunks: int | None = None,
        sqlite_cache_bytes: int | None = None,
        lexical_tokenizer: str = DEFAULT_TOKENIZER,
        quotas: Quotas | None = None,
        rebuild_deleted_fraction: float = 0.2,
        index_save_interval_s: float | None = None,
        embedder: str | None = None,
    ):
        """embedder: the profile's embedder.model_id, recorded in the store and checked on every open
        (rag/store/store_schema.py check_embedder); None checks only the vectors' dimension."""
        self.dim = dim
        self.index_kind = index_kind
        self.hnsw_m = hnsw_m
        self.hnsw_ef_search = hnsw_ef_search
        # The plan sized the index for this many chunks: past it, memory would outgrow the budget.
        self.capacity_chunks = capacity_chunks
        self.quotas = quotas or Quotas()
        # HNSW tombstones past this fraction of a collection's vectors: rebuild it from SQLite.
        self.rebuild_deleted_fraction = rebuild_deleted_fraction
        self.db_path = Path(db_path)
        self.index_dir = Path(db_path).parent / f"{Path(db_path).stem}.faiss"
        # FULL: a document the client was told is stored must survive a power loss (FAISS is rebuilt
        # from SQLite, so SQLite is the only copy). One fsync per transaction (a whole batch of documents),
        # small beside embedding them.
        self._db = connect(db_path, synchronous="FULL")
        if sqlite_cache_bytes:
            self._db.execute(f"PRAGMA cache_size=-{max(1, int(sqlite_cache_bytes) // 1024)}")  # negative: KiB
        # An older database gains the columns it lacks (chunk offsets); its old rows keep NULL there.
        self.migrated_columns = create_or_migrate(self._db)
        check_embedder(self._db, dim, embedder, str(self.db_path))
        # FAISS adds/removes are not thread-safe and SQLite's connection is shared: one lock.
        self._lock = threading.RLock()
        self._indexes: dict[tuple[str, str], CollectionIndex] = {}
        self._unsaved: set[tuple[str, str]] = set()
        # What opening did, per collection: "loaded" (from its file, `added` rows caught up from SQLite)
        # or "rebuilt" (from SQLite). For the log, and for tests that a restart re-adds nothing.
        self.opened: dict[tuple[str, str], dict] = {}
        self.lexical = LexicalIndex(lexical_tokenizer)
        self._open_all()
        self._closing = threading.Event()
        self._saver = None
        if index_save_interval_s:
            self._saver = threading.Thread(
                target=self._save_periodically, args=(index_save_interval_s,), name="faiss-index-saver", daemon=True
            )
            self._saver.start()

    # ---- index maintenance -------------------------------------------------------------
    def _new_index(self) -> CollectionIndex:
        return CollectionIndex(self.dim, self.index_kind, self.hnsw_m, self.hnsw_ef_search)

    def _index_path(self, tenant: str, collection: str) -> Path:
        """A fixed-width file name, whatever the tenant and collection are called."""
        digest = hashlib.sha256(f"{tenant}\0{collection}".encode()).hexdigest()[:32]
        return self.index_dir / f"{digest}.{self.index_kind}.index"

    def _add_rows(self, index: CollectionIndex, rows) -> int:
        rows = rows.fetchall()
        ids = np.array([r[0] for r in rows], dtype=np.int64)
        if len(ids):
            index.add(ids, np.frombuffer(b"".join(r[1] for r in rows), dtype=np.float32).reshape(len(ids), self.dim))
        return len(ids)

    def _rebuild(self, tenant: str, collection: str) -> None:
        index = self._new_index()
        self._add_rows(
            index,
            self._db.execute(
                "SELECT id, vector FROM chunks WHERE tenant=? AND collection=? ORDER BY id", (tenant, collection)
            ),
        )
        self._indexes[(tenant, collection)] = index
        self._unsaved.add((tenant, collection))

    def _open(self, tenant: str, collection: str) -> dict:
        """Load the collection's saved index and catch it up with SQLite, or rebuild it from SQLite."""
        index = CollectionIndex.load(
            self._index_path(tenant, collection), self.dim, self.index_kind, self.hnsw_m, self.hnsw_ef_search
        )
        if index is None:
            self._rebuild(tenant, collection)
            return {"rebuilt": True, "added": 0}
        stored = np.array(
            [
                r[0]
                for r in self._db.execute(
                    "SELECT id FROM chunks WHERE tenant=? AND collection=? ORDER BY id", (tenant, collection)
                )
            ],
            dtype=np.int64,
        )
        missing = index.reconcile(stored)
        added = 0
        for start in range(0, len(missing), 500):
            page = [int(i) for i in missing[start : start + 500]]
            added += self._add_rows(
                index,
                self._db.execute(
                    f"SELECT id, vector FROM chunks WHERE id IN ({','.join('?' * len(page))}) ORDER BY id", page
                ),
            )
        self._indexes[(tenant, collection)] = index
        if added or index.deleted:
            self._unsaved.add((tenant, collection))
        if index.deleted_fraction() > self.rebuild_deleted_fraction:
            self._rebuild(tenant, collection)
            return {"rebuilt": True, "added": 0}
        return {"rebuilt": False, "added": added}

    def _open_all(self) -> None:
        with self._lock:
            collections = self._db.execute("SELECT tenant, name FROM collections").fetchall()
            for tenant, name in collections:
                self.opened[(tenant, name)] = self._open(tenant, name)
            # Files of collections that no longer exist (or of another index kind) are stale caches.
            wanted = {self._index_path(t, c) for t, c in collections}
            for path in self.index_dir.glob("*.index") if self.index_dir.exists() else []:
                if path not in wanted:
                    path.unlink(missing_ok=True)
            # A database from before the lexical index (or another tokenizer) gets it from its chunk rows.
            self.lexical.migrate(self._db, collections)

    def save_indexes(self) -> int:
        """Write every index changed since its last save; returns how many were written."""
        with self._lock:
            keys = sorted(self._unsaved)
            for key in keys:
                if key in self._indexes:
                    self._indexes[key].save(self._index_path(*key))
            self._unsaved.clear()
        return len(keys)

    def _save_periodically(self, interval_s: float) -> None:
        while not self._closing.wait(interval_s):
            self.save_indexes()

    def _forget(self, tenant: str, collection: str) -> None:
        self._indexes.pop((tenant, collection), None)
        self._unsaved.discard((tenant, collection))
        self._index_path(tenant, collection).unlink(missing_ok=True)

    def _vectors(self, vectors: np.ndarray | list) -> np.ndarray:
        array = np.array(vectors, dtype=np.float32, order="C")  # a copy: normalize_L2 works in place
        if array.ndim != 2 or array.shape[1] != self.dim:
            raise ValueError(f"expected vectors of dimension {self.dim}, got shape {array.shape}")
        faiss.normalize_L2(array)  # inner product of unit vectors = cosine similarity
        return array

    # ---- writes ------------------------------------------------------------------------
    def upsert_document(
        self,
        tenant: str,
        collection: str,
        doc_id: str,
        chunks: list[str],
        vectors,
        metadata: dict | None = None,
        chars: int = 0,
    ) -> int:
        """Store (or replace) a document's chunks; returns the chunk count."""
        return self.upsert_documents(tenant, collection, [(doc_id, chunks, vectors, metadata, chars)])[0]

    def upsert_documents(self, tenant: str, collection: str, documents: list[tuple]) -> list[int]:
        """Store (or replace) several documents in ONE transaction: all of them or none.

        Each document is (doc_id, chunks, vectors, metadata, chars); a chunk is a rag.documents.chunking.Chunk
        (its offsets are stored) or plain text (stored without offsets). Returns each one's chunk count."""
        arrays = []
        for doc_id, chunks, vectors, _, _ in documents:
            array = self._vectors(vectors) if chunks else np.zeros((0, self.dim), dtype=np.float32)
            if len(array) != len(chunks):
                raise ValueError(f"document {doc_id!r}: {len(chunks)} chunks but {len(array)} vectors")
            arrays.append(array)
        now = time.time()
        with self._lock:
            check_capacity(
                self._db,
                tenant,
                collection,
                documents,
                self.quotas.of(tenant),
                sum(index.live for index in self._indexes.values()),
                self.capacity_chunks,
            )
            changes = []
            with transaction(self._db):
                cur = self._db.cursor()
                cur.execute("INSERT OR IGNORE INTO collections VALUES (?, ?, ?)", (tenant, collection, now))
                self.lexical.create(cur, tenant, collection)
                for (doc_id, chunks, _, metadata, chars), array in zip(documents, arrays):
                    old_ids = [
                        r[0]
                        for r in cur.execute(
                            "SELECT id FROM chunks WHERE tenant=? AND collection=? AND doc_id=?",
                            (tenant, collection, doc_id),
                        )
                    ]
                    self.lexical.remove(cur, tenant, collection, old_ids)
                    cur.execute(
                        "DELETE FROM chunks WHERE tenant=? AND collection=? AND doc_id=?", (tenant, collection, doc_id)
                    )
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
                    stored = json.dumps(metadata or {}, allow_nan=False)
                    cur.execute(
                        "INSERT OR REPLACE INTO documents VALUES (?,?,?,?,?,?,?)",
                        (tenant, collection, doc_id, stored, chars, len(chunks), now),
                    )
                    # From the JSON as stored (keys made strings, tuples lists), as json_each would read it.
                    write_metadata(cur, tenant, collection, doc_id, json.loads(stored))
                    changes.append((old_ids, np.array(new_ids, dtype=np.int64), array))
            key = (tenant, collection)
            if key not in self._indexes:
                self._indexes[key] = self._new_index()
            for old_ids, new_ids, array in changes:
                self._apply(key, old_ids, new_ids, array)
            self._compact(key)
        return [len(doc[1]) for doc in documents]

    def _apply(self, key: tuple[str, str], removed: list[int], added_ids: np.ndarray, added: np.ndarray) -> None:
        """Mirror one document's committed change in its FAISS index: remove (HNSW: mark deleted) its
        old ids and add its new rows. Call _compact after the whole batch, never between documents:
        a rebuild reads every committed row, so adding a later document's rows after it would add them twice."""
        index = self._indexes[key]
        index.remove(removed)
        index.add(added_ids, added)
        self._unsaved.add(key)

    def _compact(self, key: tuple[str, str]) -> None:
        """Rebuild from SQLite once deleted vectors pass the profile's fraction of the index."""
        if self._indexes[key].deleted_fraction() > self.rebuild_deleted_fraction:
            self._rebuild(*key)

    def _in_transaction(self, statements: list[tuple[str, tuple]], then=None) -> list[int]:
        """Run the statements, then `then(cursor)` if given, as one SQLite transaction; returns each
        statement's rowcount."""
        with transaction(self._db):
            cur = self._db.cursor()
            counts = [cur.execute(sql, params).rowcount for sql, params in statements]
            if then is not None:
                then(cur)
        return counts

    def delete_document(self, tenant: str, collection: str, doc_id: str) -> None:
        key = (tenant, collection, doc_id)
        with self._lock:
            self._require_collection(tenant, collection)
            ids = [
                r[0]
                for r in self._db.execute("SELECT id FROM chunks WHERE tenant=? AND collection=? AND doc_id=?", key)
            ]
            deleted, *_ = self._in_transaction(
                [
                    ("DELETE FROM documents WHERE tenant=? AND collection=? AND doc_id=?", key),
                    (self.lexical.remove_document_sql(tenant, collection), key),  # while the chunk rows still say which
                    ("DELETE FROM chunks WHERE tenant=? AND collection=? AND doc_id=?", key),
                    ("DELETE FROM document_metadata WHERE tenant=? AND collection=? AND doc_id=?", key),
                ]
            )
            if not deleted:
                raise DocumentNotFound(f"document {doc_id!r} not found in collection {collection!r}")
            self._apply((tenant, collection), ids, np.zeros(0, dtype=np.int64), np.zeros((0, self.dim), np.float32))
            self._compact((tenant, collection))

    def delete_collection(self, tenant: str, collection: str) -> None:
        with self._lock:
            self._require_collection(tenant, collection)
            self._in_transaction(
                [
                    (f"DELETE FROM {table} WHERE tenant=? AND {column}=?", (tenant, collection))
                    for table, column in (
                        ("chunks", "collection"),
                        ("documents", "collection"),
                        ("document_metadata", "collection"),
                        ("collections", "name"),
                    )
                ],
                then=lambda cur: self.lexical.drop(cur, tenant, collection),
            )
            self._forget(tenant, collection)

    def delete_tenant(self, tenant: str) -> int:
        """Remove every collection of a tenant (the tenant was deleted); returns how many."""
        with self._lock:
            names = [r[0] for r in self._db.execute("SELECT name FROM collections WHERE tenant=?", (tenant,))]
            self._in_transaction(
                [
                    (f"DELETE FROM {table} WHERE tenant=?", (tenant,))
                    for table in ("chunks", "documents", "document_metadata", "collections")
                ],
                then=lambda cur: [self.lexical.drop(cur, tenant, name) for name in names],
            )
            for name in names:
                self._forget(tenant, name)
        return len(names)

    # ---- reads -------------------------------------------------------------------------
    def _require_collection(self, tenant: str, collection: str) -> None:
        if not self._db.execute("SELECT 1 FROM collections WHERE tenant=? AND name=?", (tenant, collection)).fetchone():
            raise CollectionNotFound(f"collection {collection!r} not found")

    def list_collections(self, tenant: str) -> list[dict]:
        with self._lock:
            rows = self._list_rows(tenant)
        return [{"name": n, "created_at": t, "documents": d, "chunks": c} for n, t, d, c in rows]

    def _list_rows(self, tenant: str) -> list[tuple]:
        return self._db.execute(
            "SELECT c.name, c.created_at, COUNT(d.doc_id), COALESCE(SUM(d.chunk_count), 0) FROM collections c "
            "LEFT JOIN documents d ON d.tenant=c.tenant AND d.collection=c.name WHERE c.tenant=? "
            "GROUP BY c.name ORDER BY c.name",
            (tenant,),
        ).fetchall()

    def list_all_collections(self) -> list[dict]:
        """Every tenant's collections with their counts: the operator's view (the dashboard)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT c.tenant, c.name, COUNT(d.doc_id), COALESCE(SUM(d.chunk_count), 0) FROM collections c "
                "LEFT JOIN documents d ON d.tenant=c.tenant AND d.collection=c.name "
                "GROUP BY c.tenant, c.name ORDER BY c.tenant, c.name"
            ).fetchall()
        return [{"tenant": t, "name": n, "documents": d, "chunks": c} for t, n, d, c in rows]

    def collection_info(self, tenant: str, collection: str) -> dict:
        """Counts only (a covering index, no metadata read); the documents are paged by list_documents."""
        with self._lock:
            self._require_collection(tenant, collection)
            documents, chunks = self._db.execute(
                "SELECT count(*), COALESCE(SUM(chunk_count), 0) FROM documents WHERE tenant=? AND collection=?",
                (tenant, collection),
            ).fetchone()
            indexed = self._indexes[(tenant, collection)].live
        return {
            "name": collection,
            "document_count": documents,
            "chunk_count": chunks,
            "indexed_vectors": indexed,
            "index": self.index_kind,
        }

    def list_documents(self, tenant: str, collection: str, limit: int, after: str | None = None) -> dict:
        """One page of the collection's documents in id order: at most `limit`, those after the id `after`
        (the previous page's last_id). An index range of `limit` + 1 rows: no page costs more than its size.
        The metadata is the client's: a file's page or section map (up to rag.extraction.max_locations
        labels) stays out, so a row is at most the client's metadata limit."""
        with self._lock:
            self._require_collection(tenant, collection)
            rows = self._db.execute(
                f"SELECT doc_id, chunk_count, chars, json_remove(metadata, '$.{LOCATIONS_KEY}'), updated_at FROM documents "
                "WHERE tenant=? AND collection=? AND doc_id > ? ORDER BY doc_id LIMIT ?",
                (tenant, collection, after or "", limit + 1),
            ).fetchall()
        page = [
            {"id": d, "chunks": c, "chars": ch, "metadata": json.loads(m), "updated_at": u}
            for d, c, ch, m, u in rows[:limit]
        ]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(rows) > limit,
        }

    def search(
        self, tenant: str, collection: str, vector, top_k: int, filters: dict | None = None
    ) -> list[RetrievedChunk]:
        """Dense search: cosine similarity of the query vector with every chunk's, best first. With
        filters, only chunks of documents whose metadata matches are searched (top_k of those)."""
        query = self._vectors([vector])
        with self._lock:
            self._require_collection(tenant, collection)
            index = self._indexes[(tenant, collection)]
            if index.live == 0:
                return []
            if filters:
                return self._chunks(index.search_among(query, self._matching_ids(tenant, collection, filters), top_k))
            return self._chunks(index.search(query, top_k))

    def _matching_ids(self, tenant: str, collection: str, filters: dict) -> np.ndarray:
        """The rowids of the collection's chunks whose document's metadata matches the filters."""
        sql, params = matching_chunks_sql(tenant, collection, filters)
        return np.array([r[0] for r in self._db.execute(sql, params)], dtype=np.int64)

    def search_lexical(
        self, tenant: str, collection: str, text: str, top_k: int, filters: dict | None = None
    ) -> list[RetrievedChunk]:
        """Lexical search: FTS5 bm25 over the chunk texts (score = -bm25, higher is better), best first;
        with filters, over the chunks of matching documents only (inside the FTS5 query)."""
        with self._lock:
            self._require_collection(tenant, collection)
            only = None
            if filters:
                sql, params = matching_chunks_sql(tenant, collection, filters)
                only = (f"rowid IN ({sql})", params)
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
                found.append(
                    RetrievedChunk(
                        document_id=doc_id,
                        chunk_id=f"{doc_id}#{index}",
                        score=score,
                        text=text,
                        metadata=json.loads(metadata),
                        start=start,
                        end=end,
                    )
                )
        return found

    def stats(self) -> dict:
        with self._lock:
            vectors = sum(index.live for index in self._indexes.values())
            return {
                "collections": len(self._indexes),
                "vectors": vectors,
                "index_bytes_estimate": sum(index.index.ntotal for index in self._indexes.values()) * self.dim * 4,
                "database_bytes": self._database_bytes(),
            }

    def _database_bytes(self) -> int:
        """The database file and its WAL: what SQLite's page cache can fill with."""
        total = 0
        for suffix in ("", "-wal"):
            try:
                total += os.stat(f"{self.db_path}{suffix}").st_size
            except OSError:
                pass
        return total

    def close(self) -> None:
        """Save the changed indexes (the next start loads them) and close the database."""
        self._closing.set()
        if self._saver is not None:
            self._saver.join()
        with self._lock:
            self.save_indexes()
            self._db.close()


def _text_and_offsets(chunk: Chunk | str) -> tuple[str, int | None, int | None]:
    if isinstance(chunk, str):
        return chunk, None, None
    return chunk.text, chunk.start, chunk.end
