"""State written by the first release (tests/fixtures/state-v0, made by make_state_v0.py in that release's
schemas, PRAGMA user_version 0) opens under the current code with no manual step: both databases are
migrated to the current schema version, the old key still authenticates, usage is kept, the collection
still answers, and the FAISS and lexical indexes are rebuilt from the stored rows. Real SQLite, FAISS and
argon2; the vectors are real all-MiniLM-L6-v2 embeddings stored in the fixture."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from rag.store.knowledge_store import KnowledgeStore
from rag.store.store_schema import SCHEMA_VERSION as KNOWLEDGE_VERSION
from tenancy.models import SCHEMA_VERSION as TENANTS_VERSION
from tenancy.store import TenantStore

FIXTURE = Path(__file__).resolve().parents[3] / "fixtures" / "state-v0"
OLD_KEY = "ps_0a1b2c3d4e5f_OldReleaseKeyOldReleaseKeyOldReleaseKey0123456"
DIM = 384


def _version(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return db.execute("PRAGMA user_version").fetchone()[0]


@pytest.fixture()
def old_state(tmp_path) -> Path:
    state = tmp_path / "state"
    shutil.copytree(FIXTURE, state)  # the committed fixture is never written to
    assert _version(state / "tenants.sqlite3") == 0 and _version(state / "knowledge.sqlite3") == 0
    return state


def test_old_tenants_keys_and_usage_open_under_the_current_code(old_state):
    with TenantStore(old_state / "tenants.sqlite3") as store:
        assert _version(old_state / "tenants.sqlite3") == TENANTS_VERSION
        tenant = store.authenticate(OLD_KEY)  # an argon2-only row: verified once, then given its digest
        assert tenant is not None and tenant.name == "acme" and tenant.rpm == 60 and tenant.max_concurrency == 4
        assert store.authenticate(OLD_KEY, allow_hashing=False).name == "acme"  # the digest is stored now
        assert store.authenticate(OLD_KEY[:-1] + "7") is None
        usage = store.usage("acme")
        assert [(u.requests, u.prompt_tokens, u.completion_tokens) for u in usage] == [(12, 3400, 560)]
        assert {t.name for t in store.list_tenants()} == {"acme", "gone"}
    # Reopening a migrated database is a no-op, and the tombstones were rebuilt from the old audit log.
    with TenantStore(old_state / "tenants.sqlite3") as store:
        assert store.authenticate(OLD_KEY, allow_hashing=False).name == "acme"
    with sqlite3.connect(old_state / "tenants.sqlite3") as db:
        assert db.execute("SELECT key_id FROM revoked_keys").fetchall() == [("ffffffffffff",)]
        assert db.execute("SELECT name FROM deleted_tenants").fetchall() == [("ghost",)]


def test_old_knowledge_base_answers_and_its_indexes_are_rebuilt(old_state):
    store = KnowledgeStore(old_state / "knowledge.sqlite3", dim=DIM)
    try:
        assert _version(old_state / "knowledge.sqlite3") == KNOWLEDGE_VERSION
        assert set(store.migrated_columns) == {"chunks.start_char", "chunks.end_char"}
        assert store.stats()["vectors"] == 3  # FAISS rebuilt from the stored vectors
        listed = store.list_documents("acme", "handbook", limit=10)["data"]
        assert sorted(d["id"] for d in listed) == ["bridge", "copper", "lighthouse"]
        with sqlite3.connect(old_state / "knowledge.sqlite3") as db:
            vector = np.frombuffer(
                db.execute("SELECT vector FROM chunks WHERE doc_id = 'bridge'").fetchone()[0], dtype=np.float32
            )
        hits = store.search("acme", "handbook", vector, top_k=3)
        assert hits[0].document_id == "bridge" and hits[0].score == pytest.approx(1.0, abs=1e-4)
        assert hits[0].start is None  # rows from before offsets keep NULL there
        lexical = store.search_lexical("acme", "handbook", "Quorvex lighthouse", top_k=2)
        assert lexical and lexical[0].document_id == "lighthouse"  # the FTS5 index was built from old rows
        # The migrated store takes new documents as usual.
        assert store.upsert_documents("acme", "handbook", [("new", ["A new note."], [vector], {}, 11)]) == [1]
        assert store.stats()["vectors"] == 4
    finally:
        store.close()
    again = KnowledgeStore(old_state / "knowledge.sqlite3", dim=DIM)
    try:
        assert again.migrated_columns == [] and again.stats()["vectors"] == 4
    finally:
        again.close()


def test_a_knowledge_base_from_a_newer_version_is_refused(old_state):
    with sqlite3.connect(old_state / "knowledge.sqlite3") as db:
        db.execute(f"PRAGMA user_version = {KNOWLEDGE_VERSION + 1}")
    with pytest.raises(RuntimeError, match="newer than this code"):
        KnowledgeStore(old_state / "knowledge.sqlite3", dim=DIM)
