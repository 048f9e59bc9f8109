"""Quiet, useful logs (issue 46): a client's mistake (a missing collection or document, a malformed id, a full
quota) is one INFO line in the retriever's log, never an ERROR with a traceback, and still the client's 4xx at
the gateway; a real fault in the retriever still raises and is logged in full."""

from __future__ import annotations

import contextlib
import logging

import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient

from deployments.retriever import Retriever
from gateway.http_errors import install_error_handlers
from rag.store.capacity import CapacityExceeded
from rag.store.knowledge_store import CollectionNotFound, DocumentNotFound, KnowledgeStore
from rag.store.refusals import Refused, raise_refused, refusing
from tests.fakes.handles import FakeHandle
from tests.fakes.rag import DIM
from tests.unit.gateway.routes.test_knowledge_routes import Gateway

pytestmark = pytest.mark.timeout(60)


@contextlib.contextmanager
def captured(caplog, *names: str):
    """Every record of these loggers (Ray's do not propagate to the root, where caplog listens) and the root's."""
    loggers = [logger for logger in map(logging.getLogger, names) if not logger.propagate]
    for logger in loggers:
        logger.addHandler(caplog.handler)
    caplog.set_level(logging.DEBUG)
    try:
        yield caplog
    finally:
        for logger in loggers:
            logger.removeHandler(caplog.handler)


def _one_line_no_traceback(records: list[logging.LogRecord]) -> logging.LogRecord:
    assert len(records) == 1, [r.getMessage() for r in records]
    record = records[0]
    assert record.levelno in (logging.INFO, logging.WARNING), record.levelname
    assert record.exc_info is None and record.exc_text is None and record.stack_info is None
    assert "\n" not in record.getMessage() and "Traceback" not in record.getMessage()
    return record


@pytest.fixture
def retriever(tmp_path):
    """The retriever replica's class without Ray (Serve wraps it; its methods are the replica's own)."""
    replica = Retriever.func_or_class.__new__(Retriever.func_or_class)
    replica.store = KnowledgeStore(tmp_path / "k.sqlite3", dim=DIM)
    yield replica
    replica.store.close()


def test_a_missing_collection_is_one_info_line_in_the_retriever_and_comes_back_as_a_refusal(retriever, caplog):
    with captured(caplog, "ray.serve"):
        answer = retriever.collection_info("tenant-a", "nope")
        deleted = retriever.delete_document("tenant-a", "nope", "doc")
    assert isinstance(answer, Refused) and isinstance(answer.error, CollectionNotFound)
    assert isinstance(deleted, Refused)
    assert len(caplog.records) == 2, "one line per refused call"
    for record in caplog.records:
        _one_line_no_traceback([record])
    assert "collection_info refused" in caplog.records[0].getMessage()
    assert "CollectionNotFound: collection 'nope' not found" in caplog.records[0].getMessage()
    with pytest.raises(CollectionNotFound, match="collection 'nope' not found"):
        raise_refused(answer)  # where the gateway's call returns


def test_a_real_fault_still_raises_with_its_traceback(caplog):
    log = logging.getLogger("poolserve.test-refusals")

    @refusing(log)
    def broken():
        raise RuntimeError("the disk is gone")

    @refusing(log)
    def full():
        raise CapacityExceeded("tenant 'a' is at its quota of 10 chunks")

    with captured(caplog, "poolserve.test-refusals"):
        with pytest.raises(RuntimeError, match="the disk is gone"):
            broken()
        assert isinstance(full(), Refused)
    assert [r.getMessage() for r in caplog.records] == [
        "full refused (the client's mistake, answered as a 4xx): CapacityExceeded: tenant 'a' is at its quota of 10 chunks"
    ]
    assert raise_refused({"ok": 1}) == {"ok": 1}, "an answer passes through"


def test_a_404_through_the_gateway_logs_one_line_and_no_traceback(tmp_path, caplog):
    """The gateway's routes over a handle to the real retriever class: the 404s of a client run (a missing
    collection, its documents, a missing document) are answered, and the whole log is one INFO line each."""
    store = KnowledgeStore(tmp_path / "k.sqlite3", dim=DIM)
    gateway = Gateway(store)
    replica = Retriever.func_or_class.__new__(Retriever.func_or_class)
    replica.store = store
    gateway._retriever = FakeHandle(replica)  # through the descriptor: refusals raised where the call returns
    app = FastAPI()
    install_error_handlers(app, 10)
    app.get("/v1/collections/{collection}")(gateway.get_collection)
    app.get("/v1/collections/{collection}/documents")(gateway.list_documents)
    app.delete("/v1/collections/{collection}/documents/{document_id}")(gateway.delete_document)
    app.delete("/v1/collections/{collection}")(gateway.delete_collection)
    with captured(caplog, "ray.serve", "poolserve.gateway", "poolserve.tenants"):
        with TestClient(app, raise_server_exceptions=False) as client:
            answers = [
                client.get("/v1/collections/missing"),
                client.get("/v1/collections/missing/documents"),
                client.delete("/v1/collections/missing/documents/d1"),
                client.delete("/v1/collections/missing"),
            ]
    assert [a.status_code for a in answers] == [404] * 4
    assert all(a.json()["error"]["message"] == "collection 'missing' not found" for a in answers)
    ours = [r for r in caplog.records if r.levelno >= logging.INFO and not r.name.startswith(("httpx", "asyncio"))]
    assert len(ours) == 4, [r.getMessage() for r in ours]
    for record in ours:
        _one_line_no_traceback([record])
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    store.close()


def test_a_missing_document_in_an_existing_collection_is_a_404_too(tmp_path, caplog):
    store = KnowledgeStore(tmp_path / "k.sqlite3", dim=DIM)
    replica = Retriever.func_or_class.__new__(Retriever.func_or_class)
    replica.store = store
    import numpy as np

    from rag.documents.chunking import Chunk

    replica.upsert_documents(
        "t", "kb", [("d1", [Chunk(index=0, text="hello", start=0, end=5)], np.ones((1, DIM), dtype=np.float32), {}, 5)]
    )
    with captured(caplog, "ray.serve"):
        answer = replica.delete_document("t", "kb", "nope")
    assert isinstance(answer, Refused) and isinstance(answer.error, DocumentNotFound)
    assert "document 'nope' not found" in _one_line_no_traceback(caplog.records).getMessage()
    store.close()
