"""A knowledge store holds one embedder's vectors: it records which (the profile's embedder.model_id) and
refuses another, in the retriever (rag/store/store_schema.py check_embedder) and before a stack starts
(stackctl/launcher.py embedder_refusal)."""

import sqlite3

import numpy as np
import pytest

from planner.profile import load_profile
from rag.store.knowledge_store import KnowledgeStore
from rag.store.store_schema import EmbedderMismatch, recorded_embedder
from stackctl.launcher import embedder_refusal
from tests.unit.rag.store.test_rag_store import DIM, seed


def test_the_first_embedder_is_recorded_and_another_is_refused(tmp_path):
    path = tmp_path / "knowledge.sqlite3"
    store = KnowledgeStore(path, dim=DIM, embedder="all-minilm-l6-v2")
    seed(store)
    store.close()
    assert recorded_embedder(path) == "all-minilm-l6-v2"
    KnowledgeStore(path, dim=DIM, embedder="all-minilm-l6-v2").close()  # the same one opens
    with pytest.raises(EmbedderMismatch, match="filled by the embedder 'all-minilm-l6-v2'.*'all-mpnet-base-v2'"):
        KnowledgeStore(path, dim=DIM, embedder="all-mpnet-base-v2")


def test_a_store_from_before_the_record_is_checked_by_dimension_then_recorded(tmp_path):
    path = tmp_path / "knowledge.sqlite3"
    store = KnowledgeStore(path, dim=DIM)
    seed(store)
    store.close()
    db = sqlite3.connect(path)
    db.execute("DROP TABLE store_info")  # as a store from before the record
    db.commit()
    db.close()
    assert recorded_embedder(path) is None
    with pytest.raises(EmbedderMismatch, match=f"dimension {DIM}, but the profile's embedder makes {2 * DIM}"):
        KnowledgeStore(path, dim=2 * DIM, embedder="all-mpnet-base-v2")
    store = KnowledgeStore(path, dim=DIM, embedder="all-minilm-l6-v2")
    assert store.search("tenant-a", "docs", np.eye(DIM, dtype=np.float32)[0], 1)[0].document_id == "paris"
    store.close()
    assert recorded_embedder(path) == "all-minilm-l6-v2"


def test_an_empty_store_takes_whichever_embedder_comes_first(tmp_path):
    path = tmp_path / "knowledge.sqlite3"
    KnowledgeStore(path, dim=2 * DIM).close()  # no embedder named (benchmarks, tools): nothing recorded
    assert recorded_embedder(path) is None
    KnowledgeStore(path, dim=DIM, embedder="e1").close()
    assert recorded_embedder(tmp_path / "none.sqlite3") is None


def test_the_launcher_refuses_a_state_dir_another_embedder_filled(tmp_path):
    profile = load_profile("configs/cpu-tiny.yaml").model_copy(update={"state_dir": str(tmp_path)})
    assert embedder_refusal(profile) is None  # no store yet
    KnowledgeStore(tmp_path / "knowledge.sqlite3", dim=DIM, embedder=profile.embedder.model_id).close()
    assert embedder_refusal(profile) is None
    other = profile.model_copy(
        update={"embedder": profile.embedder.model_copy(update={"model_id": "all-mpnet-base-v2"})}
    )
    refusal = embedder_refusal(other)
    assert "'all-minilm-l6-v2'" in refusal and "'all-mpnet-base-v2'" in refusal and "own state_dir" in refusal
