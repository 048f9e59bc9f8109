"""The lexical index: one SQLite FTS5 table per collection, in the chunk store's own database.

Rows are keyed by the chunk's rowid and are written, replaced and deleted by the caller inside
the same transaction as the chunk rows, so the lexical index can never hold a chunk that SQLite
no longer has. A table per (tenant, collection), like the FAISS indexes: bm25's document
frequencies then come from the tenant's own collection, so ranking is not skewed by, and scores
reveal nothing about, another tenant's documents.

The table name carries a hash of the tokenizer: a store opened with another tokenizer builds new
tables from the chunk rows and drops the old ones (the same path migrates a database that
predates the lexical index).
"""

from __future__ import annotations

import hashlib
import sqlite3

from rag.retrieval.lexical_query import fts5_match
from system.sqlite import transaction

# Porter stemming over unicode61: "paths" finds "path", "compressed" finds "compress". Measured
# against plain unicode61 on the bench/bench_rag_quality.py corpus: within two questions either way
# (docs/BENCHMARKS.md section 7); kept for the word forms people type.
DEFAULT_TOKENIZER = "porter unicode61 remove_diacritics 2"
_PREFIX = "lexical_"


class LexicalIndex:
    def __init__(self, tokenizer: str = DEFAULT_TOKENIZER):
        if "'" in tokenizer:
            raise ValueError("the FTS5 tokenizer spec may not contain quotes")
        self.tokenizer = tokenizer
        self._salt = hashlib.sha256(tokenizer.encode()).hexdigest()[:8]

    def table(self, tenant: str, collection: str) -> str:
        """A fixed-width name of hex digits: safe to splice into SQL, whatever the tenant is called."""
        digest = hashlib.sha256(f"{self._salt}\0{tenant}\0{collection}".encode()).hexdigest()[:32]
        return f"{_PREFIX}{digest}"

    # ---- writes: all take the cursor of the caller's open transaction ---------------------
    def create(self, cur: sqlite3.Cursor, tenant: str, collection: str) -> None:
        cur.execute(
            f"CREATE VIRTUAL TABLE IF NOT EXISTS {self.table(tenant, collection)} "
            f"USING fts5(text, tokenize='{self.tokenizer}')"
        )

    def add(self, cur: sqlite3.Cursor, tenant: str, collection: str, rows: list[tuple[int, str]]) -> None:
        cur.executemany(f"INSERT INTO {self.table(tenant, collection)} (rowid, text) VALUES (?, ?)", rows)

    def remove_document_sql(self, tenant: str, collection: str) -> str:
        """SQL taking (tenant, collection, doc_id) that deletes a document's rows; run it before its chunks go."""
        return (
            f"DELETE FROM {self.table(tenant, collection)} WHERE rowid IN "
            "(SELECT id FROM chunks WHERE tenant=? AND collection=? AND doc_id=?)"
        )

    def remove(self, cur: sqlite3.Cursor, tenant: str, collection: str, ids: list[int]) -> None:
        cur.executemany(f"DELETE FROM {self.table(tenant, collection)} WHERE rowid=?", [(i,) for i in ids])

    def drop(self, cur: sqlite3.Cursor, tenant: str, collection: str) -> None:
        cur.execute(f"DROP TABLE IF EXISTS {self.table(tenant, collection)}")

    # ---- reads -------------------------------------------------------------------------------
    def search(
        self,
        db: sqlite3.Connection,
        tenant: str,
        collection: str,
        text: str,
        limit: int,
        only: tuple[str, list] | None = None,
    ) -> list[tuple[int, float]]:
        """(chunk rowid, score) best first; the score is -bm25, so higher is better as for dense.
        `only` is the caller's SQL condition on `rowid` and its parameters (metadata filters): it is
        part of the FTS5 query, so the limit counts matching rows only."""
        match = fts5_match(text)
        if match is None or limit <= 0:
            return []
        table = self.table(tenant, collection)
        condition, params = only or ("1", [])
        rows = db.execute(
            f"SELECT rowid, bm25({table}) FROM {table} WHERE {table} MATCH ? AND {condition} "
            f"ORDER BY bm25({table}) LIMIT ?",
            (match, *params, limit),
        ).fetchall()
        return [(int(rowid), -float(score)) for rowid, score in rows]

    def count(self, db: sqlite3.Connection, tenant: str, collection: str) -> int:
        return db.execute(f"SELECT count(*) FROM {self.table(tenant, collection)}").fetchone()[0]

    # ---- migration ---------------------------------------------------------------------------
    def migrate(self, db: sqlite3.Connection, collections: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Build the table of every collection that has none (from its chunk rows) and drop the
        tables no collection uses any more (another tokenizer's). Returns the collections built."""
        existing = {
            name
            for (name,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type='table' AND name LIKE ? AND sql LIKE 'CREATE VIRTUAL TABLE%'",
                (f"{_PREFIX}%",),
            )
        }
        wanted = {self.table(t, c): (t, c) for t, c in collections}
        built = [key for name, key in wanted.items() if name not in existing]
        stale = sorted(existing - set(wanted))
        if not built and not stale:
            return []
        with transaction(db):
            cur = db.cursor()
            for tenant, collection in built:
                self.create(cur, tenant, collection)
                cur.execute(
                    f"INSERT INTO {self.table(tenant, collection)} (rowid, text) "
                    "SELECT id, text FROM chunks WHERE tenant=? AND collection=?",
                    (tenant, collection),
                )
            for name in stale:
                cur.execute(f"DROP TABLE IF EXISTS {name}")
        return built
