"""Ingest jobs: the SQLite job store (rag/documents/ingest_job_store.py) and the routes (gateway/routes/ingest_jobs.py) on
the gateway stand-in of test_knowledge_routes: 202 then completed with the synchronous answer, cancel
before storing stores nothing, a job that is storing or finished is not cancellable, a silent job
reads as lost, tenants see only their own jobs."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from fastapi import HTTPException

from gateway.middleware.tenant_guard import DETACHED_KEY
from gateway.schemas import AddDocumentsRequest
from rag.documents.ingest_job_store import (
    LOST_AFTER_HEARTBEATS,
    IngestJobStore,
    JobCancelled,
    NotCancellable,
    TooManyJobs,
)
from rag.store.knowledge_store import CollectionNotFound, KnowledgeStore
from tests.fakes.rag import DIM
from tests.unit.gateway.routes.test_knowledge_routes import Gateway, request

LONG = "\n\n".join(f"Paragraph {i} about widgets." for i in range(7))


@pytest.fixture
def jobs(tmp_path):
    store = IngestJobStore(tmp_path / "jobs.sqlite3", heartbeat_s=5.0, retention_s=3600.0)
    yield store
    store.close()


def test_a_job_runs_through_its_stages_to_completed(jobs):
    job = jobs.create("acme", "kb", documents=2, limit=2)
    assert (job.status, job.stage, job.documents) == ("in_progress", "queued", 2)
    jobs.progress(job.id, "embedding", 10, 4)
    jobs.finish(job.id, "completed", result={"chunks": 10})
    done = jobs.get("acme", job.id)
    assert (done.status, done.stage, done.chunks, done.chunks_embedded) == ("completed", "done", 10, 4)
    assert done.public()["result"] == {"chunks": 10} and done.finished_at is not None


def test_another_tenant_cannot_see_or_cancel_a_job(jobs):
    job = jobs.create("acme", "kb", documents=1, limit=2)
    assert jobs.get("other", job.id) is None
    assert jobs.request_cancel("other", job.id) is None
    assert jobs.list("other", 10) == []
    assert jobs.get("acme", job.id).status == "in_progress"


def test_the_running_job_limit_is_per_tenant(jobs):
    jobs.create("acme", "kb", documents=1, limit=2)
    second = jobs.create("acme", "kb", documents=1, limit=2)
    with pytest.raises(TooManyJobs, match="limit is 2"):
        jobs.create("acme", "kb", documents=1, limit=2)
    jobs.create("other", "kb", documents=1, limit=2)  # another tenant's jobs do not count
    jobs.finish(second.id, "failed", error={"message": "x"})
    jobs.create("acme", "kb", documents=1, limit=2)  # a finished job frees its place


def test_cancel_stops_the_job_at_its_next_step(jobs):
    job = jobs.create("acme", "kb", documents=1, limit=2)
    assert jobs.request_cancel("acme", job.id).status == "cancelling"
    assert jobs.request_cancel("acme", job.id).status == "cancelling"  # asking twice is harmless
    with pytest.raises(JobCancelled):
        jobs.progress(job.id, "embedding", 5, 5)


def test_a_job_that_is_storing_or_finished_is_not_cancellable(jobs):
    job = jobs.create("acme", "kb", documents=1, limit=2)
    jobs.progress(job.id, "storing", 5, 5)  # past this point the documents are stored
    with pytest.raises(NotCancellable, match="storing"):
        jobs.request_cancel("acme", job.id)
    jobs.finish(job.id, "completed", result={})
    with pytest.raises(NotCancellable, match="completed"):
        jobs.request_cancel("acme", job.id)


def test_a_job_whose_heartbeat_stopped_reads_as_lost_and_frees_its_place(jobs):
    job = jobs.create("acme", "kb", documents=1, limit=1, now=1000.0)
    later = 1000.0 + LOST_AFTER_HEARTBEATS * jobs.heartbeat_s + 1
    lost = jobs.get("acme", job.id, now=later)
    assert (
        lost.status == "failed" and lost.error["type"] == "job_lost" and "nothing was stored" in lost.error["message"]
    )
    jobs.create("acme", "kb", documents=1, limit=1, now=later)


def test_reading_a_lost_job_writes_nothing(jobs):
    job = jobs.create("acme", "kb", documents=1, limit=2, now=1000.0)
    later = 1000.0 + LOST_AFTER_HEARTBEATS * jobs.heartbeat_s + 1
    changes_before = jobs._db.total_changes
    assert jobs.get("acme", job.id, now=later).status == "failed"
    assert [j.status for j in jobs.list("acme", 5, now=later)] == ["failed"]
    assert jobs._db.total_changes == changes_before  # a GET is a read
    assert jobs.get("acme", job.id, now=1001.0).status == "in_progress"  # not yet lost: still running
    jobs.create("acme", "kb", documents=1, limit=2, now=later)  # the next create marks it for good
    assert jobs.get("acme", job.id, now=1001.0).status == "failed"


def test_finished_jobs_are_forgotten_after_the_retention(jobs):
    old = jobs.create("acme", "kb", documents=1, limit=5)
    jobs.finish(old.id, "completed", result={})
    jobs.create("acme", "kb", documents=1, limit=5, now=jobs.get("acme", old.id).finished_at + 3601)
    assert jobs.get("acme", old.id) is None


def test_listing_pages_newest_first(jobs):
    made = [jobs.create("acme", "kb", documents=1, limit=10, now=1000.0 + i).id for i in range(5)]
    for job_id in made:
        jobs.finish(job_id, "completed", result={})
    first = jobs.list("acme", 2, now=1010.0)
    assert [j.id for j in first] == made[:2:-1][:2] == [made[4], made[3]]
    rest = jobs.list("acme", 10, before=first[-1].id, now=1010.0)
    assert [j.id for j in rest] == [made[2], made[1], made[0]]


# ---- the routes, on the gateway stand-in ------------------------------------------------------
@pytest.fixture
def gateway(tmp_path):
    store = KnowledgeStore(tmp_path / "k.sqlite3", dim=DIM)
    gw = Gateway(store)
    gw._settings = gw._settings.model_copy(update={"state_dir": str(tmp_path / "state"), "embed_batch_chunks": 3})
    yield gw
    if getattr(gw, "_ingest_job_store", None):
        gw._ingest_job_store.close()
    store.close()


def body(*documents, **options) -> AddDocumentsRequest:
    return AddDocumentsRequest.model_validate({"documents": list(documents), **options})


def test_async_and_stream_together_are_refused():
    with pytest.raises(ValueError, match="ask for one"):
        body({"id": "a", "text": "x"}, stream=True, **{"async": True})


def test_an_async_ingest_answers_202_then_completes_with_the_synchronous_answer(gateway):
    async def scenario():
        sent = request()
        response = await gateway.ingest_body("kb", body({"id": "a", "text": LONG}, **{"async": True}), sent)
        job = json.loads(response.body)
        assert response.status_code == 202 and response.headers["Location"] == f"/v1/ingest/jobs/{job['id']}"
        assert job["status"] == "in_progress" and job["counts"]["documents"] == 1
        await asyncio.wait_for(sent.scope[DETACHED_KEY], timeout=30)
        return json.loads((await gateway.get_ingest_job(job["id"], request())).body)

    done = asyncio.run(scenario())
    assert done["status"] == "completed" and done["stage"] == "done"
    assert done["counts"] == {"documents": 1, "chunks": 7, "chunks_embedded": 7}
    assert done["result"]["documents"] == [{"id": "a", "chunks": 7}] and done["result"]["tokens"] > 0
    again = json.loads(asyncio.run(gateway.ingest_body("kb", body({"id": "a", "text": LONG}), request())).body)
    assert again == done["result"]


class GatedEmbedder:
    """The embedder handle with its document batches held until `opened` is set. Without the gate the job
    can reach storing (no longer cancellable) while the cancel waits for a database thread under load."""

    def __init__(self, handle):
        self._handle, self.opened = handle, asyncio.Event()

    def __getattr__(self, name):
        method = getattr(self._handle, name)
        if name != "embed":
            return method

        async def remote(*args, **kwargs):
            await asyncio.wait_for(self.opened.wait(), timeout=30)
            return await method.remote(*args, **kwargs)

        return SimpleNamespace(remote=remote)


def test_a_cancelled_job_stores_nothing(gateway):
    gate = gateway._embedder = GatedEmbedder(gateway._embedder)

    async def scenario():
        sent = request()
        job = json.loads(
            (await gateway.ingest_body("kb", body({"id": "a", "text": LONG}, **{"async": True}), sent)).body
        )
        cancelling = await gateway.cancel_ingest_job(job["id"], request())
        assert cancelling.status_code == 202 and json.loads(cancelling.body)["status"] == "cancelling"
        gate.opened.set()
        await asyncio.wait_for(sent.scope[DETACHED_KEY], timeout=30)
        return json.loads((await gateway.get_ingest_job(job["id"], request())).body)

    cancelled = asyncio.run(scenario())
    assert cancelled["status"] == "cancelled" and cancelled["error"]["type"] == "cancelled"
    with pytest.raises(CollectionNotFound):  # not even the collection was made
        gateway._retriever.handle._target.store.list_documents("tenant-a", "kb", 10, None)


def test_a_failed_job_keeps_the_error_the_request_would_have_had(gateway):
    gateway._retriever.handle._target.store.capacity_chunks = 2

    async def scenario():
        sent = request()
        job = json.loads(
            (await gateway.ingest_body("kb", body({"id": "a", "text": LONG}, **{"async": True}), sent)).body
        )
        await asyncio.wait_for(sent.scope[DETACHED_KEY], timeout=30)
        return json.loads((await gateway.get_ingest_job(job["id"], request())).body)

    failed = asyncio.run(scenario())
    assert failed["status"] == "failed" and failed["error"]["status"] == 413
    assert "capacity" in failed["error"]["message"].lower()


def test_unknown_and_finished_jobs_answer_404_and_409(gateway):
    for unknown in ("ingest_nope", "ingest_" + "0" * 24, "\x00" * 5000, "ingest_" + "é" * 24):
        for route in (gateway.get_ingest_job, gateway.cancel_ingest_job):
            with pytest.raises(HTTPException) as missing:
                asyncio.run(route(unknown, request()))
            assert missing.value.status_code == 404 and len(missing.value.detail) < 400  # the id, cut short
    job = gateway._ingest_jobs().create("tenant-a", "kb", 1, limit=2)
    gateway._ingest_jobs().finish(job.id, "completed", result={})
    with pytest.raises(HTTPException) as finished:
        asyncio.run(gateway.cancel_ingest_job(job.id, request()))
    assert finished.value.status_code == 409 and "completed" in finished.value.detail


def test_the_listing_refuses_a_page_above_the_limit(gateway):
    with pytest.raises(HTTPException) as refused:
        asyncio.run(gateway.list_ingest_jobs(request(), limit=10_000, before=None))
    assert refused.value.status_code == 400 and "documents_page_max" in refused.value.detail
    with pytest.raises(HTTPException) as malformed:
        asyncio.run(gateway.list_ingest_jobs(request(), limit=None, before="not-a-job"))
    assert malformed.value.status_code == 400 and "not a job id" in malformed.value.detail
    listed = json.loads(asyncio.run(gateway.list_ingest_jobs(request(), limit=None, before=None)).body)
    assert listed == {"object": "list", "data": [], "has_more": False, "last_id": None}
