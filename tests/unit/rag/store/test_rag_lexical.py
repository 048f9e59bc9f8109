"""The lexical index: FTS5 query building, bm25 search, and the index staying exactly in step
with the chunk rows (same transaction) through replaces, deletes, migration and restarts."""

import sqlite3

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rag.retrieval.lexical_query import MAX_TERMS, fts5_match, quote
from rag.store.knowledge_store import CollectionNotFound, KnowledgeStore
from rag.store.lexical import LexicalIndex
from rag.store.store_schema import SCHEMA
from tests.fakes.rag import ChunkDeleteFails

DIM = 4


def vecs(n: int) -> np.ndarray:
    return np.tile(np.eye(DIM, dtype=np.float32)[0], (n, 1)) + np.arange(n, dtype=np.float32)[:, None] * 0.01


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "knowledge.sqlite3"


@pytest.fixture
def store(db_path):
    knowledge = KnowledgeStore(db_path, dim=DIM)
    yield knowledge
    knowledge.close()


def put(store, doc_id, chunks, tenant="t", collection="c"):
    return store.upsert_document(tenant, collection, doc_id, chunks, vecs(len(chunks)))


def lexical_ids(store, text, tenant="t", collection="c", top_k=10):
    return [hit.chunk_id for hit in store.search_lexical(tenant, collection, text, top_k)]


def lexical_rows(db_path, tenant="t", collection="c") -> int:
    table = LexicalIndex().table(tenant, collection)
    with sqlite3.connect(db_path) as db:
        return db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def chunk_rows(db_path, tenant="t", collection="c") -> int:
    with sqlite3.connect(db_path) as db:
        return db.execute(
            "SELECT count(*) FROM chunks WHERE tenant=? AND collection=?", (tenant, collection)
        ).fetchone()[0]


def fts_tables(db_path) -> set[str]:
    with sqlite3.connect(db_path) as db:
        return {
            n
            for (n,) in db.execute(
                "SELECT name FROM sqlite_master WHERE sql LIKE 'CREATE VIRTUAL TABLE%' AND name LIKE 'lexical_%'"
            )
        }


# ---- query building ---------------------------------------------------------------------------


def test_every_term_is_a_quoted_phrase_joined_by_or():
    assert (
        fts5_match("How does os.path.join handle paths?") == '"os path join" OR "os" OR "path" OR "join" OR '
        '"handle" OR "paths"'
    )
    assert fts5_match("E1101") == '"E1101"'
    assert fts5_match("what does --flag do") == '"flag"'
    assert fts5_match("dirs_exist_ok") == '"dirs exist ok" OR "dirs" OR "exist" OR "ok"'


def test_operators_and_column_filters_are_plain_words():
    # AND/OR/NOT/NEAR, '*', '^', ':' and parentheses all end up inside quotes (or are dropped).
    match = fts5_match('title: NEAR(alpha beta) AND gamma* OR ^delta NOT "eps" -zeta +eta')
    assert match is not None
    outside_quotes = "".join(part for i, part in enumerate(match.split('"')) if i % 2 == 0)
    assert set(outside_quotes.replace(" OR ", "")) <= {" "} or outside_quotes.strip() == ""


def test_user_phrases_stay_phrases_and_stopword_only_questions_still_search():
    assert fts5_match('find "exact phrase" now').startswith('"exact phrase"')
    assert fts5_match("what is it") == '"what" OR "is" OR "it"'


def test_nothing_searchable_gives_none_and_terms_are_bounded():
    assert fts5_match("") is None and fts5_match("?!-- ** ::") is None
    assert fts5_match(" ".join(f"word{i}" for i in range(500))).count(" OR ") == MAX_TERMS - 1


def test_quote_doubles_embedded_quotes():
    assert quote('say "hi"') == '"say ""hi"""'


@pytest.mark.parametrize(
    "question",
    [
        '"',
        '""',
        '"unbalanced',
        "a AND",
        "OR",
        "NOT x",
        "NEAR(a b, 2)",
        "col:term",
        "title:",
        "*",
        "x*",
        "^start",
        "(a OR b",
        "a) b",
        "--flag",
        "-x",
        "+y",
        "os.path.join",
        "E1101",
        "a:b:c",
        "{col1 col2}: x",
        "'single'",
        "back\\slash",
        "semi;colon",
        "ümlaut café",
        "零 一",
        "\x00nul",
        "tab\tand\nnewline",
        "a" * 5000,
    ],
)
def test_hostile_questions_never_raise(store, question):
    put(store, "d", ["some text to search"])
    store.search_lexical("t", "c", question, 5)  # must not raise an FTS5 syntax error


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_any_text_is_a_valid_match_expression(text):
    match = fts5_match(text)
    if match is None:
        return
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE f USING fts5(text, tokenize='porter unicode61 remove_diacritics 2')")
    db.execute("INSERT INTO f VALUES ('anything at all')")
    db.execute("SELECT rowid FROM f WHERE f MATCH ?", (match,)).fetchall()


@pytest.mark.parametrize(
    "question, expected",
    [
        ("what does --flag do?", "doc-flag#0"),
        ("how is os.path.join used", "doc-join#0"),
        ("pylint E1101", "doc-lint#0"),
        ("NEAR operator", "doc-ops#0"),
        ('the "AND" keyword', "doc-ops#0"),
        ("title:thing", "doc-colon#0"),
        ("dirs_exist_ok", "doc-copy#0"),
        ("O_NONBLOCK", "doc-flags#0"),
    ],
)
def test_identifiers_flags_and_operators_are_found(store, question, expected):
    put(store, "doc-flag", ["Pass --flag to enable verbose mode."])
    put(store, "doc-join", ["Use os.path.join(a, b) to build a path."])
    put(store, "doc-lint", ["Error E1101 means an attribute is missing."])
    put(store, "doc-ops", ["FTS5 knows AND, OR, NOT and the NEAR operator."])
    put(store, "doc-colon", ["A column filter looks like title:thing in a query."])
    put(store, "doc-copy", ["copytree(src, dst, dirs_exist_ok=False) copies a tree."])
    put(store, "doc-flags", ["Open with O_NONBLOCK for non-blocking reads."])
    put(store, "filler", ["Unrelated words about gardens and weather."])
    assert lexical_ids(store, question)[0] == expected


def test_stemming_matches_word_forms(store):
    put(store, "d", ["The archive was compressed with several paths."])
    assert lexical_ids(store, "compressing path") == ["d#0"]


def test_scores_are_higher_for_better_matches(store):
    put(store, "both", ["zorblax reactor output"])
    put(store, "one", ["reactor maintenance schedule"])
    put(store, "none", ["cooking bread at home"])
    hits = store.search_lexical("t", "c", "zorblax reactor", 10)
    assert [h.document_id for h in hits] == ["both", "one"]
    assert hits[0].score > hits[1].score


# ---- the index follows the chunk rows -----------------------------------------------------------


def test_replaced_document_leaves_no_stale_lexical_rows(store, db_path):
    put(store, "doc", ["The secret code word is pelican.", "second chunk"])
    put(store, "other", ["unrelated"])
    put(store, "doc", ["The secret code word is walrus."])
    assert lexical_ids(store, "pelican") == []
    assert lexical_ids(store, "walrus") == ["doc#0"]
    assert lexical_ids(store, "second chunk") == []
    assert lexical_rows(db_path) == chunk_rows(db_path) == 2


def test_deleted_document_leaves_no_stale_lexical_rows(store, db_path):
    put(store, "a", ["alpha text", "more alpha"])
    put(store, "b", ["beta text"])
    store.delete_document("t", "c", "a")
    assert lexical_ids(store, "alpha") == []
    assert lexical_ids(store, "text") == ["b#0"]
    assert lexical_rows(db_path) == chunk_rows(db_path) == 1


def test_deleted_collection_and_tenant_drop_their_tables(store, db_path):
    put(store, "a", ["alpha"], collection="one")
    put(store, "b", ["beta"], collection="two")
    put(store, "c", ["gamma"], tenant="u", collection="one")
    assert len(fts_tables(db_path)) == 3
    store.delete_collection("t", "one")
    assert len(fts_tables(db_path)) == 2
    with pytest.raises(CollectionNotFound):
        store.search_lexical("t", "one", "alpha", 5)
    put(store, "a2", ["fresh"], collection="one")  # recreated: starts empty
    assert lexical_ids(store, "alpha", collection="one") == [] and lexical_ids(store, "fresh", collection="one")
    assert store.delete_tenant("t") == 2
    assert fts_tables(db_path) == {LexicalIndex().table("u", "one")}
    assert lexical_ids(store, "gamma", tenant="u", collection="one") == ["c#0"]


def test_tenants_do_not_share_a_lexical_index(store):
    put(store, "secret", ["tenant a's quarterly numbers"], tenant="a")
    put(store, "mine", ["tenant b's notes"], tenant="b")
    assert lexical_ids(store, "quarterly numbers", tenant="b") == []
    with pytest.raises(CollectionNotFound):
        store.search_lexical("b", "missing", "x", 5)


def test_a_failed_ingest_leaves_neither_chunks_nor_lexical_rows(store, db_path):
    put(store, "keep", ["kept text"])
    with pytest.raises(ValueError):  # two chunks, one vector: refused before anything is written
        store.upsert_document("t", "c", "bad", ["x", "y"], vecs(1))
    real = store.lexical.add

    def crash(cur, tenant, collection, rows):
        real(cur, tenant, collection, rows)
        raise sqlite3.OperationalError("simulated crash after the lexical rows")

    store.lexical.add = crash
    with pytest.raises(sqlite3.OperationalError):
        put(store, "keep", ["replacement text"])
    store.lexical.add = real
    assert lexical_ids(store, "kept") == ["keep#0"] and lexical_ids(store, "replacement") == []
    assert lexical_rows(db_path) == chunk_rows(db_path) == 1


def test_lexical_index_survives_a_restart(db_path):
    first = KnowledgeStore(db_path, dim=DIM)
    put(first, "a", ["persistent words"])
    first.close()
    second = KnowledgeStore(db_path, dim=DIM)
    try:
        assert lexical_ids(second, "persistent") == ["a#0"]
    finally:
        second.close()


def test_a_database_without_the_lexical_index_gets_it_on_open(db_path):
    # A store as it was before the lexical index: the same tables, no FTS5.
    with sqlite3.connect(db_path) as db:
        db.executescript(SCHEMA)
        db.execute("INSERT INTO collections VALUES ('t', 'c', 0)")
        db.execute("INSERT INTO documents VALUES ('t', 'c', 'old', '{}', 10, 2, 0)")
        for i, text in enumerate(["legacy chunk about tortoises", "another legacy chunk"]):
            db.execute(
                "INSERT INTO chunks (tenant, collection, doc_id, chunk_index, text, vector) VALUES (?,?,?,?,?,?)",
                ("t", "c", "old", i, text, vecs(2)[i].tobytes()),
            )
    assert fts_tables(db_path) == set()
    migrated = KnowledgeStore(db_path, dim=DIM)
    try:
        assert lexical_ids(migrated, "tortoises") == ["old#0"]
        assert lexical_rows(db_path) == chunk_rows(db_path) == 2
        put(migrated, "old", ["replaced"])  # and it is maintained from then on
        assert lexical_ids(migrated, "legacy") == [] and lexical_rows(db_path) == 1
    finally:
        migrated.close()


def test_another_tokenizer_rebuilds_the_index_and_drops_the_old_tables(db_path):
    first = KnowledgeStore(db_path, dim=DIM)
    put(first, "a", ["compressed archives"])
    first.close()
    plain = KnowledgeStore(db_path, dim=DIM, lexical_tokenizer="unicode61")
    try:
        assert fts_tables(db_path) == {plain.lexical.table("t", "c")}
        assert lexical_ids(plain, "compressed") == ["a#0"]
        assert lexical_ids(plain, "compressing") == []  # no stemming with this tokenizer
    finally:
        plain.close()


def test_table_names_are_fixed_hex_whatever_the_names():
    index = LexicalIndex()
    name = index.table("tenant'; DROP TABLE chunks; --", "c")
    assert name.startswith("lexical_") and len(name) == len("lexical_") + 32
    assert name != index.table("tenant", "c") and name == index.table("tenant'; DROP TABLE chunks; --", "c")
    with pytest.raises(ValueError):
        LexicalIndex("unicode61'); DROP TABLE chunks; --")


def test_a_failed_delete_keeps_the_lexical_rows_with_their_chunks(store, db_path):
    put(store, "a", ["alpha words"])

    real = store._db
    store._db = ChunkDeleteFails(real)
    with pytest.raises(sqlite3.OperationalError):
        store.delete_document("t", "c", "a")  # the lexical rows went first, then the transaction failed
    store._db = real
    assert lexical_ids(store, "alpha") == ["a#0"]
    assert lexical_rows(db_path) == chunk_rows(db_path) == 1
