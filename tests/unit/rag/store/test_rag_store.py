import sqlite3
import threading
import time

import numpy as np
import pytest

from rag.retrieval.prompt import RetrievedChunk
from rag.store.knowledge_store import CollectionNotFound, DocumentNotFound, KnowledgeStore
from tests.fakes.rag import ChunkDeleteFails

DIM = 8
E = np.eye(DIM, dtype=np.float32)


def vec(*weights: float) -> np.ndarray:
    """A DIM-dimensional vector from leading weights, e.g. vec(1, 1) = e0 + e1."""
    out = np.zeros(DIM, dtype=np.float32)
    out[: len(weights)] = weights
    return out


@pytest.fixture(params=["flat", "hnsw"])
def kind(request):
    return request.param


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "state" / "knowledge.sqlite3"  # parent directory is created by the store


@pytest.fixture
def store(db_path, kind):
    knowledge = KnowledgeStore(db_path, dim=DIM, index_kind=kind)
    yield knowledge
    knowledge.close()


def hits(results: list[RetrievedChunk]) -> list[tuple[str, str, float]]:
    return [(r.document_id, r.chunk_id, round(r.score, 5)) for r in results]


def seed(store, tenant="tenant-a", collection="docs"):
    # Vectors are deliberately not unit length: the store normalises them (cosine similarity).
    store.upsert_document(
        tenant,
        collection,
        "paris",
        ["Paris is in France.", "Paris has the Seine."],
        [vec(5), vec(2, 2)],
        metadata={"lang": "en"},
        chars=40,
    )
    store.upsert_document(tenant, collection, "rome", ["Rome is in Italy."], [vec(0, 0, 3)], chars=17)
    store.upsert_document(tenant, collection, "berlin", ["Berlin is in Germany."], [vec(0, 0.5)], chars=21)


def test_upsert_then_search_returns_best_first_with_cosine_scores(store):
    seed(store)
    results = store.search("tenant-a", "docs", vec(10), top_k=3)
    assert hits(results) == [
        ("paris", "paris#0", 1.0),
        ("paris", "paris#1", round(1 / np.sqrt(2), 5)),
        # e0 is orthogonal to both rome and berlin: score 0, either may come third
        (results[2].document_id, results[2].chunk_id, 0.0),
    ]
    assert results[2].document_id in {"rome", "berlin"}
    assert results[0].text == "Paris is in France."
    assert results[1].text == "Paris has the Seine."
    assert results[0].metadata == {"lang": "en"}

    # q = (-1, 2, 1), |q| = sqrt(6): berlin 2/sqrt(6), rome 1/sqrt(6), paris#1 1/sqrt(12), paris#0 -1/sqrt(6)
    results = store.search("tenant-a", "docs", vec(-1, 2, 1), top_k=4)
    assert [r.chunk_id for r in results] == ["berlin#0", "rome#0", "paris#1", "paris#0"]
    assert [r.score for r in results] == pytest.approx(
        [2 / np.sqrt(6), 1 / np.sqrt(6), 1 / np.sqrt(12), -1 / np.sqrt(6)], abs=1e-5
    )
    assert results[1].metadata == {}
    assert all(isinstance(r.score, float) for r in results)


def test_scores_do_not_depend_on_vector_length(store):
    store.upsert_document("t", "c", "d", ["x"], [vec(1000, 1000)])
    (small,) = store.search("t", "c", vec(0.001), top_k=1)
    (large,) = store.search("t", "c", vec(1e6), top_k=1)
    assert small.score == pytest.approx(large.score, abs=1e-6) == pytest.approx(1 / np.sqrt(2), abs=1e-6)


def test_top_k_larger_than_the_collection_returns_everything(store):
    seed(store)
    results = store.search("tenant-a", "docs", vec(1, 1, 1, 1), top_k=100)
    assert sorted(r.chunk_id for r in results) == ["berlin#0", "paris#0", "paris#1", "rome#0"]
    assert [r.score for r in results] == sorted((r.score for r in results), reverse=True)


def test_top_k_limits_the_results(store):
    seed(store)
    assert [r.chunk_id for r in store.search("tenant-a", "docs", vec(1), top_k=1)] == ["paris#0"]


def test_search_in_empty_collection_returns_nothing(store):
    store.upsert_document("t", "c", "empty", [], [])
    assert store.search("t", "c", vec(1), top_k=5) == []
    info = store.collection_info("t", "c")
    assert info["document_count"] == 1 and info["chunk_count"] == 0 and info["indexed_vectors"] == 0


def test_collection_info_and_listing(store):
    seed(store)
    info = store.collection_info("tenant-a", "docs")
    assert info["name"] == "docs" and info["index"] == store.index_kind
    assert info["document_count"] == 3 and info["chunk_count"] == 4 and info["indexed_vectors"] == 4
    assert "documents" not in info  # counts only: the documents are paged
    listing = store.list_documents("tenant-a", "docs", limit=10)
    docs = {d["id"]: d for d in listing["data"]}
    assert [d["id"] for d in listing["data"]] == ["berlin", "paris", "rome"]  # ordered by id
    assert (listing["first_id"], listing["last_id"], listing["has_more"]) == ("berlin", "rome", False)
    assert docs["paris"]["chunks"] == 2 and docs["paris"]["chars"] == 40 and docs["paris"]["metadata"] == {"lang": "en"}
    assert docs["rome"]["metadata"] == {}
    (listed,) = store.list_collections("tenant-a")
    assert listed["name"] == "docs" and listed["documents"] == 3 and listed["chunks"] == 4
    assert listed["created_at"] > 0


def test_tenant_isolation(store):
    seed(store, tenant="tenant-a")
    assert store.list_collections("tenant-b") == []
    with pytest.raises(CollectionNotFound, match="docs"):
        store.search("tenant-b", "docs", vec(1), top_k=3)
    with pytest.raises(CollectionNotFound):
        store.collection_info("tenant-b", "docs")
    with pytest.raises(CollectionNotFound):
        store.delete_collection("tenant-b", "docs")
    with pytest.raises(CollectionNotFound):
        store.delete_document("tenant-b", "docs", "paris")

    # Tenant B may own a collection of the same name; the two never mix.
    store.upsert_document("tenant-b", "docs", "paris", ["B's own paris"], [vec(0, 0, 0, 1)])
    assert [r.text for r in store.search("tenant-b", "docs", vec(1), top_k=10)] == ["B's own paris"]
    assert len(store.search("tenant-a", "docs", vec(1), top_k=10)) == 4
    assert store.collection_info("tenant-a", "docs")["chunk_count"] == 4
    assert store.collection_info("tenant-b", "docs")["chunk_count"] == 1

    # Deleting B's collection leaves A's intact.
    store.delete_collection("tenant-b", "docs")
    assert store.list_collections("tenant-b") == []
    assert [c["name"] for c in store.list_collections("tenant-a")] == ["docs"]
    assert store.search("tenant-a", "docs", vec(1), top_k=1)[0].chunk_id == "paris#0"


def test_reupsert_replaces_the_chunks(store):
    seed(store)
    n = store.upsert_document(
        "tenant-a", "docs", "paris", ["Paris, new text."], [vec(0, 0, 0, 0, 1)], metadata={"v": 2}, chars=16
    )
    assert n == 1
    info = store.collection_info("tenant-a", "docs")
    assert info["chunk_count"] == info["indexed_vectors"] == 3
    listed = store.list_documents("tenant-a", "docs", limit=10)["data"]
    assert {d["id"]: d["chunks"] for d in listed} == {"berlin": 1, "paris": 1, "rome": 1}
    assert store.stats()["vectors"] == 3

    results = store.search("tenant-a", "docs", vec(1), top_k=10)
    assert "Paris is in France." not in [r.text for r in results]
    assert "paris#1" not in [r.chunk_id for r in results]
    (best,) = store.search("tenant-a", "docs", vec(0, 0, 0, 0, 1), top_k=1)
    assert (best.chunk_id, best.text, best.metadata) == ("paris#0", "Paris, new text.", {"v": 2})
    assert best.score == pytest.approx(1.0, abs=1e-6)

    # Growing again works too.
    assert store.upsert_document("tenant-a", "docs", "paris", ["a", "b", "c"], [vec(1), vec(1), vec(1)]) == 3
    info = store.collection_info("tenant-a", "docs")
    assert info["chunk_count"] == info["indexed_vectors"] == 5


def test_delete_document_removes_it_from_search(store):
    seed(store)
    store.delete_document("tenant-a", "docs", "paris")
    results = store.search("tenant-a", "docs", vec(1), top_k=10)
    assert sorted(r.document_id for r in results) == ["berlin", "rome"]
    info = store.collection_info("tenant-a", "docs")
    assert info["document_count"] == 2 and info["chunk_count"] == info["indexed_vectors"] == 2
    with pytest.raises(DocumentNotFound, match="paris"):
        store.delete_document("tenant-a", "docs", "paris")


def test_delete_unknown_document_raises(store):
    seed(store)
    with pytest.raises(DocumentNotFound, match="nope"):
        store.delete_document("tenant-a", "docs", "nope")
    assert store.collection_info("tenant-a", "docs")["indexed_vectors"] == 4


def test_unknown_collection_raises(store):
    for call in (
        lambda: store.search("t", "missing", vec(1), 1),
        lambda: store.collection_info("t", "missing"),
        lambda: store.delete_document("t", "missing", "d"),
        lambda: store.delete_collection("t", "missing"),
    ):
        with pytest.raises(CollectionNotFound, match="missing"):
            call()


def test_delete_collection(store):
    seed(store)
    seed(store, collection="other")
    store.delete_collection("tenant-a", "docs")
    assert [c["name"] for c in store.list_collections("tenant-a")] == ["other"]
    with pytest.raises(CollectionNotFound):
        store.search("tenant-a", "docs", vec(1), top_k=1)
    assert store.stats()["collections"] == 1 and store.stats()["vectors"] == 4
    # Recreating it starts empty.
    store.upsert_document("tenant-a", "docs", "new", ["fresh"], [vec(1)])
    assert [r.chunk_id for r in store.search("tenant-a", "docs", vec(1), top_k=10)] == ["new#0"]


def test_wrong_vector_dimension_raises(store):
    with pytest.raises(ValueError, match="dimension 8"):
        store.upsert_document("t", "c", "d", ["x"], np.ones((1, DIM + 1), dtype=np.float32))
    with pytest.raises(ValueError, match="dimension 8"):
        store.upsert_document("t", "c", "d", ["x"], np.ones(DIM, dtype=np.float32))  # 1-D, not a matrix
    # Nothing was written by the failed calls.
    assert store.list_collections("t") == []
    store.upsert_document("t", "c", "d", ["x"], [vec(1)])
    with pytest.raises(ValueError, match="dimension 8"):
        store.search("t", "c", np.ones(DIM - 1, dtype=np.float32), top_k=1)


def test_chunk_and_vector_counts_must_match(store):
    with pytest.raises(ValueError, match="2 chunks but 1 vectors"):
        store.upsert_document("t", "c", "d", ["x", "y"], [vec(1)])
    assert store.list_collections("t") == []


def test_stats_counts_vectors_and_the_database_the_cache_can_fill_with(store):
    empty = store.stats()
    assert {k: v for k, v in empty.items() if k != "database_bytes"} == {
        "collections": 0,
        "vectors": 0,
        "index_bytes_estimate": 0,
    }
    seed(store)
    store.upsert_document("tenant-b", "other", "d", ["x"], [vec(1)])
    stats = store.stats()
    assert {k: v for k, v in stats.items() if k != "database_bytes"} == {
        "collections": 2,
        "vectors": 5,
        "index_bytes_estimate": 5 * DIM * 4,
    }
    assert stats["database_bytes"] > empty["database_bytes"] > 0
    store.delete_document("tenant-a", "docs", "paris")
    assert store.stats()["vectors"] == 3


def test_persistence_rebuilds_indexes_from_sqlite(db_path, kind):
    first = KnowledgeStore(db_path, dim=DIM, index_kind=kind)
    seed(first)
    first.upsert_document("tenant-b", "notes", "n1", ["note"], [vec(0, 1, 1)], metadata={"k": [1, 2]})
    first.upsert_document("tenant-a", "docs", "rome", ["Rome, replaced."], [vec(0, 0, 0, 1)])
    first.delete_document("tenant-a", "docs", "berlin")
    queries = [vec(1), vec(0, 1), vec(0, 0, 0, 1), vec(1, 1, 1, 1)]
    before = [hits(first.search("tenant-a", "docs", q, top_k=10)) for q in queries]
    before_b = first.search("tenant-b", "notes", vec(0, 1), top_k=10)
    info_before = first.collection_info("tenant-a", "docs")
    stats_before = first.stats()
    first.close()

    second = KnowledgeStore(db_path, dim=DIM, index_kind=kind)
    try:
        assert [hits(second.search("tenant-a", "docs", q, top_k=10)) for q in queries] == before
        assert second.search("tenant-b", "notes", vec(0, 1), top_k=10) == before_b
        assert before_b[0].metadata == {"k": [1, 2]}
        assert second.collection_info("tenant-a", "docs") == info_before

        def counts(stats: dict) -> dict:  # the database's size changes at close (its WAL is checkpointed)
            return {k: v for k, v in stats.items() if k != "database_bytes"}

        assert (
            counts(second.stats())
            == counts(stats_before)
            == {"collections": 2, "vectors": 4, "index_bytes_estimate": 4 * DIM * 4}
        )
        assert "berlin" not in {r.document_id for r in second.search("tenant-a", "docs", vec(0, 1), top_k=10)}
        # The reopened store keeps working.
        second.delete_document("tenant-a", "docs", "paris")
        assert [r.chunk_id for r in second.search("tenant-a", "docs", vec(1), top_k=10)] == ["rome#0"]
    finally:
        second.close()


def test_index_kind_can_change_across_restarts(db_path):
    first = KnowledgeStore(db_path, dim=DIM, index_kind="flat")
    seed(first)
    expected = hits(first.search("tenant-a", "docs", vec(1, 1), top_k=4))
    first.close()
    second = KnowledgeStore(db_path, dim=DIM, index_kind="hnsw")
    try:
        assert hits(second.search("tenant-a", "docs", vec(1, 1), top_k=4)) == expected
        assert second.collection_info("tenant-a", "docs")["index"] == "hnsw"
    finally:
        second.close()


def test_sqlite_is_the_source_of_truth(db_path):
    knowledge = KnowledgeStore(db_path, dim=DIM)
    seed(knowledge)
    knowledge.close()
    with sqlite3.connect(db_path) as db:
        rows = db.execute(
            "SELECT doc_id, chunk_index, text, vector FROM chunks ORDER BY doc_id, chunk_index"
        ).fetchall()
    assert [(d, i, t) for d, i, t, _ in rows] == [
        ("berlin", 0, "Berlin is in Germany."),
        ("paris", 0, "Paris is in France."),
        ("paris", 1, "Paris has the Seine."),
        ("rome", 0, "Rome is in Italy."),
    ]
    stored = {(d, i): np.frombuffer(v, dtype=np.float32) for d, i, _, v in rows}
    np.testing.assert_allclose(stored[("paris", 1)], vec(1, 1) / np.sqrt(2), atol=1e-6)  # stored normalised
    for vector in stored.values():
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-6)


def test_hnsw_searches_with_the_configured_ef_search(db_path):
    import faiss

    knowledge = KnowledgeStore(db_path, dim=DIM, index_kind="hnsw", hnsw_ef_search=100)
    try:
        knowledge.upsert_document("t", "c", "d", ["a", "b"], [E[0], E[1]])
        knowledge.delete_document("t", "c", "d")  # a rebuilt HNSW index keeps the setting too
        knowledge.upsert_document("t", "c", "d", ["a"], [E[0]])
        assert faiss.downcast_index(knowledge._indexes[("t", "c")].index.index).hnsw.efSearch == 100
    finally:
        knowledge.close()


def test_hnsw_replace_and_delete_keep_the_index_consistent(db_path):
    knowledge = KnowledgeStore(db_path, dim=DIM, index_kind="hnsw")
    try:
        rng = np.random.default_rng(0)
        for i in range(30):
            knowledge.upsert_document("t", "c", f"d{i}", [f"d{i} a", f"d{i} b"], rng.normal(size=(2, DIM)))
        for i in range(0, 30, 3):  # replace every third document with a single known vector
            knowledge.upsert_document("t", "c", f"d{i}", [f"d{i} new"], [E[i % DIM] + 0.01])
        for i in range(1, 30, 3):
            knowledge.delete_document("t", "c", f"d{i}")
        info = knowledge.collection_info("t", "c")
        assert info["document_count"] == 20
        assert info["chunk_count"] == info["indexed_vectors"] == 10 * 1 + 10 * 2
        results = knowledge.search("t", "c", rng.normal(size=DIM), top_k=100)
        assert len(results) == 30
        assert not {r.document_id for r in results} & {f"d{i}" for i in range(1, 30, 3)}
        assert not any(r.text.endswith((" a", " b")) and int(r.document_id[1:]) % 3 == 0 for r in results)
        best = knowledge.search("t", "c", E[3] + 0.01, top_k=1)[0]
        assert best.text in {f"d{i} new" for i in range(0, 30, 3) if i % DIM == 3}
    finally:
        knowledge.close()


def test_concurrent_upserts_and_searches(db_path, kind):
    knowledge = KnowledgeStore(db_path, dim=DIM, index_kind=kind)
    errors: list[BaseException] = []
    done = {"upserts": 0, "searches": 0}
    lock = threading.Lock()  # for the counters: += on a dict item is not atomic across threads
    # Bounded by counts, not by a clock: a loaded machine does the same work, only slower.
    deadline = time.monotonic() + 60
    n_writers, n_docs, upserts_each, searches_each = 3, 6, 12, 12

    def writer(w: int) -> None:
        rng = np.random.default_rng(w)
        i = 0
        try:
            for i in range(upserts_each):
                doc = f"w{w}-d{i % n_docs}"
                n_chunks = int(rng.integers(1, 4))
                knowledge.upsert_document(
                    "t", "c", doc, [f"{doc} #{j}" for j in range(n_chunks)], rng.normal(size=(n_chunks, DIM))
                )
                if i % 7 == 6:
                    knowledge.delete_document("t", "c", doc)
                with lock:
                    done["upserts"] += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def reader(r: int) -> None:
        rng = np.random.default_rng(100 + r)
        searches = 0
        try:
            # Searches run while the writers write, and at least searches_each of them in all.
            while (any(t.is_alive() for t in writers) or searches < searches_each) and time.monotonic() < deadline:
                try:
                    results = knowledge.search("t", "c", rng.normal(size=DIM), top_k=5)
                except CollectionNotFound:
                    continue  # before the first upsert
                assert len(results) <= 5
                assert [x.score for x in results] == sorted((x.score for x in results), reverse=True)
                for x in results:
                    assert x.chunk_id.startswith(x.document_id + "#") and x.text.startswith(x.document_id)
                info = knowledge.collection_info("t", "c")
                assert info["chunk_count"] == info["indexed_vectors"]
                knowledge.list_collections("t")
                knowledge.stats()
                searches += 1
                with lock:
                    done["searches"] += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    writers = [threading.Thread(target=writer, args=(w,)) for w in range(n_writers)]
    threads = writers + [threading.Thread(target=reader, args=(r,)) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=max(0.1, deadline + 5 - time.monotonic()))
    try:
        assert not any(thread.is_alive() for thread in threads)
        assert errors == []
        assert done["upserts"] == n_writers * upserts_each and done["searches"] >= 2 * searches_each
        info = knowledge.collection_info("t", "c")
        assert info["chunk_count"] == info["indexed_vectors"] == knowledge.stats()["vectors"]
        assert info["document_count"] <= n_writers * n_docs
        (listed,) = knowledge.list_collections("t")
        assert listed["chunks"] == info["chunk_count"] and listed["documents"] == info["document_count"]
        assert len(knowledge.search("t", "c", vec(1), top_k=1000)) == info["chunk_count"]
    finally:
        knowledge.close()
    # And SQLite agrees after a restart.
    reopened = KnowledgeStore(db_path, dim=DIM, index_kind=kind)
    try:
        assert reopened.collection_info("t", "c")["indexed_vectors"] == info["chunk_count"]
    finally:
        reopened.close()


# ---- regressions: the caller's vectors stay untouched; deletes are atomic ----------------------


@pytest.mark.parametrize("read_only", [False, True])
def test_upsert_does_not_modify_the_callers_vectors(store, read_only):
    vectors = np.stack([vec(3), vec(1, 1)])
    original = vectors.copy()
    vectors.flags.writeable = not read_only
    store.upsert_document("t", "c", "d", ["x", "y"], vectors)
    np.testing.assert_array_equal(vectors, original)


def test_failed_delete_document_leaves_no_orphan_chunks(db_path):
    knowledge = KnowledgeStore(db_path, dim=DIM)
    seed(knowledge)
    real_db = knowledge._db
    knowledge._db = ChunkDeleteFails(real_db)
    with pytest.raises(sqlite3.OperationalError):
        knowledge.delete_document("tenant-a", "docs", "paris")
    knowledge._db = real_db
    knowledge.close()

    reopened = KnowledgeStore(db_path, dim=DIM)
    try:
        info = reopened.collection_info("tenant-a", "docs")
        # Either the delete happened completely or not at all; the index matches SQLite's documents.
        assert info["indexed_vectors"] == info["chunk_count"]
        assert len(reopened.search("tenant-a", "docs", vec(1), top_k=1)) == 1
    finally:
        reopened.close()


# ---- chunk offsets and their migration --------------------------------------------------------

# The schema as released before chunk offsets existed (rag/store/store_schema.py adds start_char, end_char).
SCHEMA_WITHOUT_OFFSETS = """
CREATE TABLE collections (tenant TEXT NOT NULL, name TEXT NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (tenant, name));
CREATE TABLE documents (tenant TEXT NOT NULL, collection TEXT NOT NULL, doc_id TEXT NOT NULL,
    metadata TEXT NOT NULL, chars INTEGER NOT NULL, chunk_count INTEGER NOT NULL, updated_at REAL NOT NULL,
    PRIMARY KEY (tenant, collection, doc_id));
CREATE TABLE chunks (id INTEGER PRIMARY KEY AUTOINCREMENT, tenant TEXT NOT NULL, collection TEXT NOT NULL,
    doc_id TEXT NOT NULL, chunk_index INTEGER NOT NULL, text TEXT NOT NULL, vector BLOB NOT NULL);
CREATE INDEX chunks_by_doc ON chunks (tenant, collection, doc_id);
"""


def test_chunks_keep_their_offsets(store):
    from rag.documents.chunking import Chunk

    text = "Paris is in France. Paris has the Seine."
    chunks = [Chunk(0, "Paris is in France.", 0, 19), Chunk(1, "Paris has the Seine.", 20, 40)]
    store.upsert_document("t", "c", "paris", chunks, [vec(1), vec(0, 1)], metadata={"lang": "en"}, chars=len(text))
    store.upsert_document("t", "c", "plain", ["No offsets given."], [vec(0, 0, 1)])
    for result in store.search("t", "c", vec(1, 1, 1), top_k=3) + store.search_lexical("t", "c", "Paris offsets", 3):
        if result.document_id == "paris":
            assert text[result.start : result.end] == result.text
        else:
            assert (result.start, result.end) == (None, None)


def test_a_database_without_offset_columns_opens_migrates_and_keeps_its_rows(db_path, kind):
    db_path.parent.mkdir(parents=True)
    with sqlite3.connect(db_path) as db:
        db.executescript(SCHEMA_WITHOUT_OFFSETS)
        db.execute("INSERT INTO collections VALUES ('t', 'c', 0)")
        db.execute("""INSERT INTO documents VALUES ('t', 'c', 'old', '{"source": "hr"}', 20, 1, 0)""")
        db.execute(
            "INSERT INTO chunks (tenant, collection, doc_id, chunk_index, text, vector) VALUES (?,?,?,?,?,?)",
            ("t", "c", "old", 0, "An old chunk of text", (vec(1) / 1.0).tobytes()),
        )
    migrated = KnowledgeStore(db_path, dim=DIM, index_kind=kind)
    try:
        assert migrated.migrated_columns == ["chunks.start_char", "chunks.end_char"]
        (old,) = migrated.search("t", "c", vec(1), top_k=5, filters={"source": "hr"})
        assert (old.document_id, old.text, old.start, old.end) == ("old", "An old chunk of text", None, None)
        assert old.citation()["start"] is None and old.citation()["end"] is None  # citations say null
        assert [r.chunk_id for r in migrated.search_lexical("t", "c", "old chunk", 5)] == ["old#0"]
        from rag.documents.chunking import Chunk

        migrated.upsert_document("t", "c", "new", [Chunk(0, "A new one", 2, 11)], [vec(0, 1)])
        assert [(r.start, r.end) for r in migrated.search("t", "c", vec(0, 1), top_k=1)] == [(2, 11)]
    finally:
        migrated.close()
    reopened = KnowledgeStore(db_path, dim=DIM, index_kind=kind)  # a second open finds nothing to add
    try:
        assert reopened.migrated_columns == [] and reopened.collection_info("t", "c")["chunk_count"] == 2
    finally:
        reopened.close()


# ---- metadata filters inside the searches -----------------------------------------------------


def seed_many(store, tenant="t", collection="c", documents=60):
    """Documents in two groups; the rare "archive" group is the least similar to e0 and never says 'common'."""
    rng = np.random.default_rng(3)
    for i in range(documents):
        rare = i % 10 == 0
        vector = (E[0] * (0.1 if rare else 1.0)) + rng.normal(scale=0.05, size=DIM).astype(np.float32) + E[1] * 0.5
        store.upsert_document(
            tenant,
            collection,
            f"d{i:02d}",
            [f"{'rare' if rare else 'common'} words {i}"],
            [vector],
            metadata={"shelf": "archive" if rare else "main", "n": i, "tags": ["x", f"t{i % 3}"]},
        )


def test_filtered_dense_search_returns_top_k_of_the_matching_chunks(store):
    seed_many(store)
    query = vec(1)
    assert not any(r.metadata["shelf"] == "archive" for r in store.search("t", "c", query, top_k=10))
    results = store.search("t", "c", query, top_k=4, filters={"shelf": "archive"})
    assert len(results) == 4 and all(r.metadata["shelf"] == "archive" for r in results)
    everything = store.search("t", "c", query, top_k=60)
    expected = [r.chunk_id for r in everything if r.metadata["shelf"] == "archive"][:4]
    assert [r.chunk_id for r in results] == expected  # the same order and scores as unfiltered
    assert len(store.search("t", "c", query, top_k=20, filters={"shelf": "archive"})) == 6  # all there are
    assert store.search("t", "c", query, top_k=5, filters={"shelf": "none"}) == []
    both = store.search("t", "c", query, top_k=60, filters={"tags": "t1", "n": {"in": [1, 4, 5, 7, 30]}})
    assert sorted(r.document_id for r in both) == ["d01", "d04", "d07"]


def test_filtered_lexical_search_limits_inside_the_query(store):
    seed_many(store)
    results = store.search_lexical("t", "c", "words", 3, filters={"shelf": "archive"})
    assert len(results) == 3 and all(r.metadata["shelf"] == "archive" for r in results)
    assert store.search_lexical("t", "c", "common", 5, filters={"shelf": "archive"}) == []


def test_hnsw_filtered_search_falls_back_to_exact_scores_when_the_graph_walk_misses(db_path, monkeypatch):
    knowledge = KnowledgeStore(db_path, dim=DIM, index_kind="hnsw")
    try:
        seed_many(knowledge)
        exact = [r.chunk_id for r in knowledge.search("t", "c", vec(1), top_k=60) if r.metadata["shelf"] == "archive"]
        real_search = knowledge._indexes[("t", "c")].search

        class Shortsighted:  # an HNSW walk that finds one match only
            def __getattr__(self, name):
                return getattr(index, name)

            def search(self, query, k, params=None):
                scores, ids = real_search(query, k, params=params)
                return scores[:, :1], ids[:, :1]

        index = knowledge._indexes[("t", "c")]
        knowledge._indexes[("t", "c")] = Shortsighted()
        results = knowledge.search("t", "c", vec(1), top_k=5, filters={"shelf": "archive"})
        assert [r.chunk_id for r in results] == exact[:5]
    finally:
        knowledge.close()


def test_filters_never_cross_tenants_or_collections(store):
    seed_many(store, tenant="a", collection="c", documents=20)
    seed_many(store, tenant="b", collection="c", documents=20)
    seed_many(store, tenant="a", collection="other", documents=20)
    results = store.search("a", "c", vec(1), top_k=50, filters={"shelf": "archive"})
    assert sorted(r.document_id for r in results) == ["d00", "d10"]
    assert len(store.search_lexical("a", "c", "rare", 50, filters={"shelf": "archive"})) == 2
