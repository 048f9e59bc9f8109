"""Ingest jobs on the real stack: a 202 at once, a job that completes with what a synchronous ingest
answers (and RAG then cites it), a job cancelled by DELETE that stores nothing, another tenant that
cannot see or cancel a job, and the CLI following a job for a large file."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import pytest

POLL_S = 0.5
JOB_WAIT_S = 300.0


def _new_tenant(stack, admin_headers) -> dict:
    response = httpx.post(
        f"{stack.url}/admin/tenants", headers=admin_headers, timeout=30, json={"name": f"jobs-{uuid.uuid4().hex[:8]}"}
    )
    assert response.status_code == 201, response.text
    return {"Authorization": f"Bearer {response.json()['api_key']}"}


def _until_finished(http: httpx.Client, job_id: str) -> tuple[dict, list[dict]]:
    seen = []
    deadline = time.monotonic() + JOB_WAIT_S
    while time.monotonic() < deadline:
        job = http.get(f"/v1/ingest/jobs/{job_id}").json()
        seen.append(job)
        if job["status"] in ("completed", "failed", "cancelled"):
            return job, seen
        time.sleep(POLL_S)
    pytest.fail(f"job {job_id} did not finish in {JOB_WAIT_S}s: {seen[-1]}")


def _manual(paragraphs: int) -> str:
    return "\n\n".join(
        f"Section {i}. The Quillmark press model {i} prints {i * 7} pages per minute on "
        f"recycled paper and needs toner cartridge QK-{i:04d}."
        for i in range(paragraphs)
    )


def test_an_async_ingest_answers_202_and_completes_then_rag_cites_it(stack, client):
    text = "The Quillmark Q9 press ships with a 12-year warranty.\n\n" + _manual(40)
    started = time.monotonic()
    response = client.post(
        "/v1/collections/jobs-kb/documents", json={"async": True, "documents": [{"id": "q9", "text": text}]}
    )
    assert response.status_code == 202, response.text
    assert time.monotonic() - started < 30
    job = response.json()
    assert response.headers["Location"] == f"/v1/ingest/jobs/{job['id']}"
    assert job["object"] == "ingest.job" and job["status"] == "in_progress" and job["counts"]["documents"] == 1
    done, seen = _until_finished(client, job["id"])
    assert done["status"] == "completed", done
    assert done["result"]["documents"] == [{"id": "q9", "chunks": done["counts"]["chunks"]}]
    assert done["counts"]["chunks_embedded"] == done["counts"]["chunks"] > 1 and done["result"]["tokens"] > 0
    listed = client.get("/v1/ingest/jobs", params={"limit": 100}).json()
    assert job["id"] in [j["id"] for j in listed["data"]]
    answer = client.post(
        "/v1/rag/query",
        json={"collection": "jobs-kb", "top_k": 2, "question": "How long is the Quillmark Q9 warranty?"},
    ).json()
    assert answer["citations"][0]["document_id"] == "q9"


def test_a_job_cancelled_by_delete_stores_nothing_and_other_tenants_cannot_touch_it(stack, client, admin_headers):
    # ~2.6 MB in 8 documents: thousands of chunks, tens of seconds of embedding; the DELETE comes at once
    response = client.post(
        "/v1/collections/jobs-cancel/documents",
        json={"async": True, "documents": [{"id": f"big-{i}", "text": _manual(3000)} for i in range(8)]},
    )
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    cancelling = client.delete(f"/v1/ingest/jobs/{job_id}")
    assert cancelling.status_code == 202, cancelling.text
    assert cancelling.json()["status"] == "cancelling"
    with httpx.Client(base_url=stack.url, headers=_new_tenant(stack, admin_headers), timeout=30) as other:
        assert other.get(f"/v1/ingest/jobs/{job_id}").status_code == 404
        assert other.delete(f"/v1/ingest/jobs/{job_id}").status_code == 404
        assert all(j["id"] != job_id for j in other.get("/v1/ingest/jobs").json()["data"])
    done, _ = _until_finished(client, job_id)
    assert done["status"] == "cancelled" and "nothing was stored" in done["error"]["message"]
    assert client.get("/v1/collections/jobs-cancel/documents").status_code == 404  # not even the collection
    again = client.delete(f"/v1/ingest/jobs/{job_id}")
    assert again.status_code == 409 and "cancelled" in again.json()["error"]["message"]


def test_the_cli_follows_large_files_as_jobs(stack, tmp_path):
    from rich.console import Console

    from cli.client import StackClient
    from cli.files import walk
    from cli.ingest import JOB_MIN_BYTES, ingest_files
    from tests.integration.conftest import DEMO_KEY

    # Real documents (a freedesktop.org PDF spec, libxslt's HTML pages) with the job threshold at 4 KiB,
    # so all but the smallest go as jobs; the default threshold (1 MiB) is minutes of embedding here.
    data = Path(__file__).resolve().parents[1] / "data"
    real = [
        data / "shared-mime-info-spec.pdf",
        data / "libxslt-tutorial-latin1.html",
        data / "exslt-intro.html",
        data / "libxslt-general.html",
    ]
    files, missing = walk(real)
    assert not missing and JOB_MIN_BYTES == 1 << 20
    with StackClient(stack.url, DEMO_KEY) as http:
        report = ingest_files(
            http, "jobs-cli", files, Console(file=open(tmp_path / "out.txt", "w")), job_min_bytes=4096
        )
        jobs = http.request("GET", "/v1/ingest/jobs", params={"limit": 100})["data"]
        answer = http.request(
            "POST",
            "/v1/rag/query",
            json={"collection": "jobs-cli", "top_k": 3, "question": "What is the shared MIME-info database?"},
        )
    assert report.failed == [] and report.sent == 4 and report.chunks > 20
    assert (
        sum(j["collection"] == "jobs-cli" and j["status"] == "completed" for j in jobs) == 3
    )  # the 3.4 KB one streamed
    # a file named directly is stored under its own name (cli/files.py walk)
    assert any(c["document_id"] == "shared-mime-info-spec.pdf" for c in answer["citations"]), answer
