"""The FAISS side of the store: batches that replace and add (flat and HNSW), soft deletes and their
threshold rebuild, and indexes saved to files that a restart loads instead of re-adding every vector."""

import numpy as np
import pytest

from rag.store.knowledge_store import KnowledgeStore

DIM = 8
E = np.eye(DIM, dtype=np.float32)


@pytest.fixture(params=["flat", "hnsw"])
def kind(request):
    return request.param


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "state" / "knowledge.sqlite3"


def ntotal(store, tenant="t", collection="c"):
    return store._indexes[(tenant, collection)].index.ntotal


def test_a_batch_that_replaces_one_document_and_adds_another_adds_each_vector_once(db_path, kind):
    store = KnowledgeStore(db_path, dim=DIM, index_kind=kind, rebuild_deleted_fraction=0.9)
    try:
        store.upsert_documents("t", "c", [("a", ["a0", "a1"], [E[0], E[1]], {}, 4), ("b", ["b0"], [E[2]], {}, 2)])
        # One batch: replace a (2 chunks -> 1), add c (2 chunks).
        store.upsert_documents("t", "c", [("a", ["a new"], [E[3]], {}, 5), ("c", ["c0", "c1"], [E[4], E[5]], {}, 4)])
        info = store.collection_info("t", "c")
        assert info["chunk_count"] == info["indexed_vectors"] == 4
        # HNSW keeps the two replaced vectors as tombstones; flat removes them. Never a duplicate of c.
        assert ntotal(store) == (6 if kind == "hnsw" else 4)
        results = store.search("t", "c", np.ones(DIM), top_k=10)
        assert sorted(r.chunk_id for r in results) == ["a#0", "b#0", "c#0", "c#1"]  # each once
        assert [r.text for r in store.search("t", "c", E[4], top_k=1)] == ["c0"]
        assert [r.text for r in store.search("t", "c", E[0], top_k=4)].count("a0") == 0
    finally:
        store.close()


def test_hnsw_replacing_a_document_does_not_rebuild_the_collection(db_path, monkeypatch):
    store = KnowledgeStore(db_path, dim=DIM, index_kind="hnsw", rebuild_deleted_fraction=0.5)
    try:
        rng = np.random.default_rng(1)
        store.upsert_documents("t", "c", [(f"d{i}", ["x", "y"], rng.normal(size=(2, DIM)), {}, 2) for i in range(20)])
        rebuilds = []
        original = store._rebuild
        monkeypatch.setattr(store, "_rebuild", lambda *key: (rebuilds.append(key), original(*key)))
        index_before = store._indexes[("t", "c")]
        store.upsert_documents("t", "c", [("d3", ["new"], [E[6]], {}, 3), ("n", ["n"], [E[7]], {}, 1)])
        assert rebuilds == [] and store._indexes[("t", "c")] is index_before
        assert ntotal(store) == 42 and store.collection_info("t", "c")["indexed_vectors"] == 40
        assert [r.chunk_id for r in store.search("t", "c", E[6], top_k=1)] == ["d3#0"]
        assert "d3#1" not in {r.chunk_id for r in store.search("t", "c", np.ones(DIM), top_k=100)}
        # Past the threshold (half the vectors deleted) the collection is rebuilt from SQLite, once per batch.
        store.upsert_documents("t", "c", [(f"d{i}", [], [], {}, 0) for i in range(4, 16)])
        assert rebuilds == [("t", "c")]
        assert ntotal(store) == store.collection_info("t", "c")["indexed_vectors"] == 16
        assert len(store.search("t", "c", np.ones(DIM), top_k=100)) == 16
    finally:
        store.close()


def test_hnsw_filtered_search_skips_deleted_vectors(db_path):
    store = KnowledgeStore(db_path, dim=DIM, index_kind="hnsw")
    try:
        store.upsert_document("t", "c", "a", ["old"], [E[0]], metadata={"k": 1})
        store.upsert_document("t", "c", "a", ["new"], [E[1]], metadata={"k": 1})
        assert [r.text for r in store.search("t", "c", E[0], top_k=5, filters={"k": 1})] == ["new"]
        assert [r.text for r in store.search("t", "c", E[0], top_k=5)] == ["new"]
    finally:
        store.close()


def test_a_restart_loads_the_saved_index_without_re_adding_vectors(db_path, kind, monkeypatch):
    first = KnowledgeStore(db_path, dim=DIM, index_kind=kind)
    rng = np.random.default_rng(2)
    first.upsert_documents("t", "c", [(f"d{i}", ["x", "y"], rng.normal(size=(2, DIM)), {}, 2) for i in range(10)])
    first.upsert_documents("t", "c", [("d1", ["z"], [E[3]], {}, 1)])
    query = rng.normal(size=DIM)
    before = [(r.chunk_id, round(r.score, 5)) for r in first.search("t", "c", query, top_k=30)]
    first.close()  # saves the index
    assert list(first.index_dir.glob("*.index"))

    added = []
    import rag.store.vector_index as vector_index

    original_add = vector_index.CollectionIndex.add
    monkeypatch.setattr(
        vector_index.CollectionIndex,
        "add",
        lambda self, ids, vectors: (added.append(len(ids)), original_add(self, ids, vectors)),
    )
    second = KnowledgeStore(db_path, dim=DIM, index_kind=kind)
    try:
        assert second.opened[("t", "c")] == {"rebuilt": False, "added": 0}
        assert added == []  # nothing re-added: the file was loaded whole
        assert [(r.chunk_id, round(r.score, 5)) for r in second.search("t", "c", query, top_k=30)] == before
        assert second.collection_info("t", "c")["indexed_vectors"] == 19
        # The replaced document's old vector stays deleted after the restart (HNSW keeps it as a tombstone).
        assert "d1#1" not in {r.chunk_id for r in second.search("t", "c", query, top_k=30)}
    finally:
        second.close()


def test_a_stale_index_file_is_caught_up_from_sqlite(db_path, kind):
    first = KnowledgeStore(db_path, dim=DIM, index_kind=kind, rebuild_deleted_fraction=0.9)
    first.upsert_document("t", "c", "a", ["a"], [E[0]])
    first.upsert_document("t", "c", "b", ["b"], [E[1]])
    first.save_indexes()
    # Written after the save, as if the process had crashed before the next one.
    first.upsert_document("t", "c", "c", ["c"], [E[2]])
    first.delete_document("t", "c", "a")
    first._unsaved.clear()
    first._db.close()

    second = KnowledgeStore(db_path, dim=DIM, index_kind=kind, rebuild_deleted_fraction=0.9)
    try:
        assert second.opened[("t", "c")] == {"rebuilt": False, "added": 1}
        assert sorted(r.chunk_id for r in second.search("t", "c", np.ones(DIM), top_k=10)) == ["b#0", "c#0"]
        assert second.collection_info("t", "c")["indexed_vectors"] == 2
    finally:
        second.close()


def test_an_unreadable_or_other_kind_index_file_is_rebuilt_from_sqlite(db_path):
    first = KnowledgeStore(db_path, dim=DIM, index_kind="flat")
    first.upsert_document("t", "c", "a", ["a"], [E[0]])
    first.close()
    (path,) = first.index_dir.glob("*.index")
    path.write_bytes(b"not a faiss index")
    second = KnowledgeStore(db_path, dim=DIM, index_kind="flat")
    assert second.opened[("t", "c")]["rebuilt"] and second.stats()["vectors"] == 1
    second.close()
    third = KnowledgeStore(db_path, dim=DIM, index_kind="hnsw")  # another kind: its own file, rebuilt
    try:
        assert third.opened[("t", "c")]["rebuilt"]
        assert [r.chunk_id for r in third.search("t", "c", E[0], top_k=1)] == ["a#0"]
    finally:
        third.close()
    assert [p.name.split(".")[1] for p in first.index_dir.glob("*.index")] == ["hnsw"]  # the flat one is gone


def test_deleting_a_collection_removes_its_index_file(db_path):
    store = KnowledgeStore(db_path, dim=DIM)
    try:
        store.upsert_document("t", "c", "a", ["a"], [E[0]])
        store.upsert_document("t", "keep", "a", ["a"], [E[0]])
        assert store.save_indexes() == 2
        store.delete_collection("t", "c")
        assert len(list(store.index_dir.glob("*.index"))) == 1
        store.delete_tenant("t")
        assert list(store.index_dir.glob("*.index")) == []
    finally:
        store.close()


def test_indexes_are_saved_in_the_background_while_they_have_changes(db_path):
    store = KnowledgeStore(db_path, dim=DIM, index_save_interval_s=0.05)
    try:
        store.upsert_document("t", "c", "a", ["a"], [E[0]])
        import time

        deadline = time.monotonic() + 5
        while not list(store.index_dir.glob("*.index")) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert list(store.index_dir.glob("*.index")) and not store._unsaved
    finally:
        store.close()
