"""Metadata filters over an indexed table instead of a JSON scan.

Every document's metadata is also stored as rows of `document_metadata` (tenant, collection,
doc_id, key, kind, value): one row per top-level scalar, one per scalar item of a top-level list.
Filters (rag/retrieval/filters.py, whose semantics this keeps exactly) then become index lookups on
(tenant, collection, key, kind, value) rather than json_each over every chunk's document.

`kind` keeps JSON's types apart the way json_each does: 'text', 'number' (integers and reals
compare by value: 2024 matches 2024.0), 'true' and 'false'. Objects, nulls and nested lists never
match a filter, so they get no row.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from rag.retrieval.filters import Scalar, normalize_filters, partition_values

_INT_RANGE = (-(2**63), 2**63 - 1)  # SQLite's integers; json_each reads larger ones as reals


def _row(value: Any) -> tuple[str, Scalar | None] | None:
    """(kind, value) of one JSON value a filter could match, None for what never matches."""
    if isinstance(value, bool):
        return ("true" if value else "false"), None
    if isinstance(value, int):
        return "number", value if _INT_RANGE[0] <= value <= _INT_RANGE[1] else float(value)
    if isinstance(value, float):
        return "number", value
    if isinstance(value, str):
        return "text", value
    return None


def metadata_rows(metadata: dict) -> list[tuple[str, str, Scalar | None]]:
    """(key, kind, value) rows of a document's metadata, without duplicates."""
    rows: dict[tuple, None] = {}
    for key, value in metadata.items():
        for item in value if isinstance(value, list) else [value]:
            row = _row(item)
            if row is not None:
                rows[(key, *row)] = None
    return list(rows)


def write_metadata(cur: sqlite3.Cursor, tenant: str, collection: str, doc_id: str, metadata: dict) -> None:
    """Replace a document's rows; call inside the transaction that writes its documents row."""
    cur.execute(
        "DELETE FROM document_metadata WHERE tenant=? AND collection=? AND doc_id=?", (tenant, collection, doc_id)
    )
    cur.executemany(
        "INSERT INTO document_metadata VALUES (?,?,?,?,?,?)",
        [(tenant, collection, doc_id, *row) for row in metadata_rows(metadata)],
    )


def fill_from_documents(cur: sqlite3.Cursor) -> int:
    """Migration: the rows of every stored document (a database from before the table); returns how many
    documents. Reads the documents in pages so a large store is not loaded at once."""
    last, done = ("", "", ""), 0
    while True:
        page = cur.execute(
            "SELECT tenant, collection, doc_id, metadata FROM documents WHERE (tenant, collection, "
            "doc_id) > (?,?,?) ORDER BY tenant, collection, doc_id LIMIT 500",
            last,
        ).fetchall()
        if not page:
            return done
        for tenant, collection, doc_id, metadata in page:
            write_metadata(cur, tenant, collection, doc_id, json.loads(metadata))
        done += len(page)
        last = page[-1][:3]


def _kind_match(values: list[Scalar]) -> tuple[str, list]:
    texts, numbers, booleans = partition_values(values)
    clauses, params = [], []
    if texts:
        clauses.append(f"(kind = 'text' AND value IN ({','.join('?' * len(texts))}))")
        params += texts
    if numbers:
        clauses.append(f"(kind = 'number' AND value IN ({','.join('?' * len(numbers))}))")
        params += numbers
    if booleans:
        clauses.append(f"kind IN ({','.join('?' * len(booleans))})")
        params += booleans
    return "(" + " OR ".join(clauses) + ")", params


def matching_chunks_sql(tenant: str, collection: str, filters: Any) -> tuple[str, list]:
    """SELECT of the rowids of a collection's chunks whose document matches every filter, and its
    parameters. Each filter is one uncorrelated lookup on the metadata index, computed once; keys and
    values travel as parameters only."""
    clauses, params = [], [tenant, collection]
    for key, condition in normalize_filters(filters).items():
        match, match_params = _kind_match(condition["in"])
        clauses.append(
            f"c.doc_id IN (SELECT doc_id FROM document_metadata WHERE tenant=? AND collection=? AND key=? AND {match})"
        )
        params += [tenant, collection, key, *match_params]
    where = " AND ".join(clauses) or "1"
    return f"SELECT c.id FROM chunks c WHERE c.tenant=? AND c.collection=? AND {where}", params
