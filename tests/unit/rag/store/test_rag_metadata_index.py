"""The metadata index (rag/store/metadata_index.py) answers every filter exactly as the json_each condition of
rag/retrieval/filters.py (the documented semantics) does; the store fills it on ingest and on migration; listings
page; quotas refuse with the tenant's own figures."""

import json
import sqlite3

import numpy as np
import pytest

from rag.retrieval.filters import metadata_condition
from rag.store.capacity import CapacityExceeded, Quotas, TenantQuota
from rag.store.knowledge_store import KnowledgeStore

DIM = 4
E = np.eye(DIM, dtype=np.float32)
DOCS = {
    "a": {"source": "hr", "year": 2024, "draft": False, "tags": ["policy", "travel"]},
    "b": {"source": "hr", "year": 2025.0, "draft": True},
    "c": {"source": "it", "year": "2024", "nested": {"source": "hr"}},
    "d": {"source": ["hr", "it"], "a.b": "dotted", "sp ace[0]": "odd", "ünï": "cödé", 'q"uo\\te': 1},
    "e": {},
    "f": {"year": 1, "draft": 1, "tags": [["policy"], {"x": "travel"}, None, True, 2024]},
    "g": {"year": None, "source": "", "tags": [], "big": 2**70, "pi": 3.5},
}
FILTERS = [
    {},
    {"source": "hr"},
    {"source": "hr", "year": 2024},
    {"year": 2025},
    {"year": "2024"},
    {"year": {"in": [2024, "2024"]}},
    {"draft": False},
    {"draft": True},
    {"draft": 1},
    {"draft": {"in": [True, False]}},
    {"tags": "travel"},
    {"tags": "policy"},
    {"tags": True},
    {"tags": 2024},
    {"tags": {"in": ["x", "policy"]}},
    {"nested": "hr"},
    {"a.b": "dotted"},
    {"sp ace[0]": "odd"},
    {"ünï": "cödé"},
    {'q"uo\\te': 1},
    {"year": 1},
    {"year": 1.0},
    {"source": ""},
    {"pi": 3.5},
    {"big": float(2**70)},
    {"missing": "x"},
    {"year": {"in": [True]}},
]


@pytest.fixture
def store(tmp_path):
    knowledge = KnowledgeStore(tmp_path / "k.sqlite3", dim=DIM)
    knowledge.upsert_documents("t", "c", [(d, [f"{d} text"], [E[0]], m, 1) for d, m in DOCS.items()])
    yield knowledge
    knowledge.close()


def json_each_matches(filters) -> set[str]:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE docs (id TEXT, metadata TEXT)")
    db.executemany("INSERT INTO docs VALUES (?, ?)", [(k, json.dumps(v)) for k, v in DOCS.items()])
    condition, params = metadata_condition(filters, "metadata")
    return {row[0] for row in db.execute(f"SELECT id FROM docs WHERE {condition}", params)}


@pytest.mark.parametrize("filters", FILTERS, ids=[json.dumps(f) for f in FILTERS])
def test_the_metadata_index_matches_exactly_what_json_each_matches(store, filters):
    found = {r.document_id for r in store.search("t", "c", E[0], top_k=50, filters=filters or None)}
    assert found == json_each_matches(filters)
    lexical = {r.document_id for r in store.search_lexical("t", "c", "text", top_k=50, filters=filters or None)}
    assert lexical == found


def test_replacing_and_deleting_a_document_updates_its_metadata_rows(store):
    store.upsert_document("t", "c", "a", ["a text"], [E[0]], metadata={"source": "it"})
    assert "a" not in {r.document_id for r in store.search("t", "c", E[0], top_k=50, filters={"source": "hr"})}
    assert "a" in {r.document_id for r in store.search("t", "c", E[0], top_k=50, filters={"source": "it"})}
    store.delete_document("t", "c", "a")
    rows = store._db.execute("SELECT count(*) FROM document_metadata WHERE doc_id='a'").fetchone()[0]
    assert rows == 0
    store.delete_collection("t", "c")
    assert store._db.execute("SELECT count(*) FROM document_metadata").fetchone()[0] == 0


def test_a_database_from_before_the_metadata_index_gets_it_filled_on_open(tmp_path):
    path = tmp_path / "k.sqlite3"
    first = KnowledgeStore(path, dim=DIM)
    first.upsert_documents("t", "c", [(d, [f"{d} text"], [E[0]], m, 1) for d, m in DOCS.items()])
    first.close()
    with sqlite3.connect(path) as db:  # as a version-1 database was: no table, user_version 1
        db.execute("DROP TABLE document_metadata")
        db.execute("PRAGMA user_version = 1")
    second = KnowledgeStore(path, dim=DIM)
    try:
        assert second._db.execute("PRAGMA user_version").fetchone()[0] == 2
        for filters in FILTERS[1:]:
            assert {
                r.document_id for r in second.search("t", "c", E[0], top_k=50, filters=filters)
            } == json_each_matches(filters)
    finally:
        second.close()


def test_the_filter_query_uses_the_metadata_index(store):
    from rag.store.metadata_index import matching_chunks_sql

    sql, params = matching_chunks_sql("t", "c", {"tags": {"in": ["policy", "x"]}})
    plan = " ".join(row[-1] for row in store._db.execute(f"EXPLAIN QUERY PLAN {sql}", params))
    assert "metadata_by_value" in plan and "json_each" not in sql


def test_document_listing_pages_by_id(store):
    seen, after, pages = [], None, 0
    while True:
        page = store.list_documents("t", "c", limit=3, after=after)
        seen += [d["id"] for d in page["data"]]
        pages += 1
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert seen == sorted(DOCS) and pages == 3
    assert store.list_documents("t", "c", limit=3, after="g") == {
        "object": "list",
        "data": [],
        "first_id": None,
        "last_id": None,
        "has_more": False,
    }
    first = store.list_documents("t", "c", limit=1)["data"][0]
    assert first == {"id": "a", "chunks": 1, "chars": 1, "metadata": DOCS["a"], "updated_at": first["updated_at"]}


def test_a_tenant_quota_refuses_first_and_names_only_that_tenants_figures(tmp_path):
    quotas = Quotas(TenantQuota(chunks=5, documents=3), {"big": TenantQuota(chunks=50)})
    store = KnowledgeStore(tmp_path / "k.sqlite3", dim=DIM, capacity_chunks=13, quotas=quotas)
    try:
        store.upsert_documents("big", "c", [(f"d{i}", ["x"] * 2, [E[0]] * 2, {}, 1) for i in range(4)])  # 8 chunks
        store.upsert_documents("small", "c", [("a", ["x"] * 4, [E[0]] * 4, {}, 1)])
        with pytest.raises(CapacityExceeded) as refused:
            store.upsert_documents("small", "c", [("b", ["x"] * 2, [E[0]] * 2, {}, 1)])
        assert "4 chunks of its quota of 5" in str(refused.value) and "8" not in str(refused.value)
        store.upsert_documents("small", "c", [("a", ["x"] * 5, [E[0]] * 5, {}, 1)])  # a replacement fits
        with pytest.raises(CapacityExceeded, match="stores 1 documents of its quota of 3; this ingest adds 3 new"):
            store.upsert_documents("small", "c", [("b", [], [], {}, 0), ("c", [], [], {}, 0), ("d", [], [], {}, 0)])
        # Under its own quota, but the store is full (14 > 13): the refusal names no other tenant's figures.
        with pytest.raises(CapacityExceeded) as full:
            store.upsert_documents("big", "c", [("e", ["x"], [E[0]], {}, 1)])
        message = str(full.value)
        assert "this tenant stores 8 chunks" in message and "13" not in message and "14" not in message
        assert store.stats()["vectors"] == 13  # nothing of the refused ingests was stored
    finally:
        store.close()
