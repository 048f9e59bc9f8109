"""The knowledge store's SQLite schema, and the migrations that bring an older database up to it.

Migrations only add: an older database opens, gains what is missing, and keeps every row.
PRAGMA user_version records the schema a database is at: 0 is the first release (no chunk offsets,
no version), 1 has the chunk offsets, 2 the metadata index (rag/store/metadata_index.py), filled from the
documents' metadata when an older database opens.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from rag.store.metadata_index import fill_from_documents
from system.sqlite import transaction

SCHEMA_VERSION = 2
# The knowledge store's file in a stack's state_dir (the retriever opens it; the launcher and upgrades read it).
STORE_FILE = "knowledge.sqlite3"
SCHEMA = """
CREATE TABLE IF NOT EXISTS collections (
    tenant TEXT NOT NULL, name TEXT NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (tenant, name));
CREATE TABLE IF NOT EXISTS documents (
    tenant TEXT NOT NULL, collection TEXT NOT NULL, doc_id TEXT NOT NULL,
    metadata TEXT NOT NULL, chars INTEGER NOT NULL, chunk_count INTEGER NOT NULL, updated_at REAL NOT NULL,
    PRIMARY KEY (tenant, collection, doc_id));
CREATE TABLE IF NOT EXISTS chunks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant TEXT NOT NULL, collection TEXT NOT NULL, doc_id TEXT NOT NULL,
    chunk_index INTEGER NOT NULL, text TEXT NOT NULL, vector BLOB NOT NULL,
    start_char INTEGER, end_char INTEGER);
CREATE INDEX IF NOT EXISTS chunks_by_doc ON chunks (tenant, collection, doc_id);
-- Counts and quotas read these columns from the index, never the rows' (large) metadata.
CREATE INDEX IF NOT EXISTS documents_sizes ON documents (tenant, collection, chunk_count);
CREATE TABLE IF NOT EXISTS document_metadata (
    tenant TEXT NOT NULL, collection TEXT NOT NULL, doc_id TEXT NOT NULL,
    key TEXT NOT NULL, kind TEXT NOT NULL, value);
CREATE INDEX IF NOT EXISTS metadata_by_value ON document_metadata (tenant, collection, key, kind, value);
CREATE INDEX IF NOT EXISTS metadata_by_doc ON document_metadata (tenant, collection, doc_id);
-- Facts about the whole store: "embedder", the profile's embedder.model_id whose vectors the chunks hold.
CREATE TABLE IF NOT EXISTS store_info (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

# Columns added after the first release, with their SQL types. Rows written before have NULL there:
# a chunk's character offsets in its document (document[start_char:end_char] == text), for citations.
ADDED_COLUMNS = {"chunks": {"start_char": "INTEGER", "end_char": "INTEGER"}}


def create_or_migrate(db: sqlite3.Connection) -> list[str]:
    """Create the tables, then add the columns an older database lacks, then record SCHEMA_VERSION.
    Returns the columns added. A database from a newer version is refused: this code would not know it."""
    found = db.execute("PRAGMA user_version").fetchone()[0]
    if found > SCHEMA_VERSION:
        raise RuntimeError(
            f"the knowledge store is at schema {found}, newer than this code's {SCHEMA_VERSION}; "
            "run the newer poolserve (or restore a backup)"
        )
    db.executescript(SCHEMA)
    added = []
    for table, columns in ADDED_COLUMNS.items():
        present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        for column, kind in columns.items():
            if column in present:
                continue
            try:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            except sqlite3.OperationalError as exc:  # another process opening the same file added it first
                if "duplicate column" not in str(exc):
                    raise
                continue
            added.append(f"{table}.{column}")
    if found < 2:
        _fill_metadata_index(db)
    if found < SCHEMA_VERSION:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    return added


class EmbedderMismatch(RuntimeError):
    """The store's vectors were made by another embedder than the one the profile names."""


def check_embedder(db: sqlite3.Connection, dim: int, embedder: str | None, where: str) -> None:
    """Refuse a store whose vectors another embedder made: searching them with this one's questions would
    rank nonsense (or, at another dimension, fail on every rebuild). The profile's embedder.model_id is
    recorded on first use; a store from before the record is checked by its vectors' dimension, then takes
    the record."""
    row = db.execute("SELECT length(vector) FROM chunks LIMIT 1").fetchone()
    if row is not None and row[0] != dim * 4:
        raise EmbedderMismatch(
            f"the knowledge store {where} holds vectors of dimension {row[0] // 4}, but the profile's embedder "
            f"makes {dim}: another embedder filled it. Give this profile its own state_dir, or go back to the "
            "embedder that filled it."
        )
    if embedder is None:
        return
    recorded = db.execute("SELECT value FROM store_info WHERE key = 'embedder'").fetchone()
    if recorded is None:
        with transaction(db):
            db.execute("INSERT OR IGNORE INTO store_info (key, value) VALUES ('embedder', ?)", (embedder,))
    elif recorded[0] != embedder:
        raise EmbedderMismatch(embedder_mismatch(where, recorded[0], embedder))


def embedder_mismatch(where: str, recorded: str, embedder: str) -> str:
    """What to tell the operator whose profile names another embedder than the store's."""
    return (
        f"the knowledge store {where} was filled by the embedder {recorded!r}, and the profile's is "
        f"{embedder!r}: its vectors cannot be searched with this one's. Give this profile its own state_dir "
        f"(or move the old one away and ingest again), or go back to {recorded!r}."
    )


def recorded_embedder(db_path) -> str | None:
    """The embedder a store file records, read-only; None where there is no file or no record yet."""
    if not Path(db_path).exists():
        return None
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        row = db.execute("SELECT value FROM store_info WHERE key = 'embedder'").fetchone()
    except sqlite3.OperationalError:  # a store from before the record
        return None
    finally:
        db.close()
    return row[0] if row else None


def _fill_metadata_index(db: sqlite3.Connection) -> None:
    """The metadata rows of a database from before version 2, in one transaction; the version is
    re-read inside it so that two processes opening the same old file fill it once."""
    with transaction(db):
        cur = db.cursor()
        if cur.execute("PRAGMA user_version").fetchone()[0] < 2:
            fill_from_documents(cur)
            cur.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
