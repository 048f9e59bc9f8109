"""Ingest jobs over HTTP, mixed into the gateway through IngestRoutes:

- `POST /v1/collections/{c}/documents` with `"async": true` answers 202 with the job (and a Location
  header) as soon as the body is checked; the ingest then runs in this replica, in its own task;
- `GET /v1/ingest/jobs/{id}`: its status (in_progress, cancelling, completed, failed, cancelled),
  stage, counts (documents, chunks, chunks_embedded), and the ingest's result or error;
- `GET /v1/ingest/jobs`: the tenant's jobs, newest first, paged by `limit` and `before`;
- `DELETE /v1/ingest/jobs/{id}`: cancel. The job stops at its next step and stores nothing (an
  ingest stores all its documents in one transaction at the end); once it is storing, 409.

A job is the request that started it, carried on: it keeps that request's concurrency slot and TPM
reservation until it ends (the tenant middleware settles them then, gateway/middleware/tenant_guard.py
`detach`), and each embedder call is charged to the tenant as it runs. The state lives in SQLite
(rag/documents/ingest_job_store.py), so any gateway replica answers GET and DELETE.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging

from fastapi import HTTPException, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response

from gateway.http_errors import map_exception
from gateway.middleware.tenant_guard import detach
from gateway.work import page_limit
from rag.documents.ingest_job_store import IngestJobStore, JobCancelled, NotCancellable, TooManyJobs, is_job_id
from rag.retrieval.pipeline import DocumentInput, IngestProgress

logger = logging.getLogger("poolserve.ingest")
JOBS_PATH = "/v1/ingest/jobs"


class IngestJobRoutes:
    """Needs from the gateway: _settings, _tenant, and IngestRoutes._ingest."""

    def _ingest_jobs(self) -> IngestJobStore:
        store = getattr(self, "_ingest_job_store", None)
        if store is None:
            store = self._ingest_job_store = IngestJobStore(
                f"{self._settings.state_dir}/ingest_jobs.sqlite3",
                heartbeat_s=self._settings.ingest_job_heartbeat_s,
                retention_s=self._settings.ingest_job_retention_s,
            )
        return store

    async def start_ingest_job(
        self, request: Request, tenant: str, collection: str, inputs: list[DocumentInput]
    ) -> Response:
        jobs = self._ingest_jobs()
        try:
            job = await run_in_threadpool(
                jobs.create, tenant, collection, len(inputs), self._settings.max_ingest_jobs_per_tenant
            )
        except TooManyJobs as exc:
            raise HTTPException(429, str(exc), headers={"Retry-After": str(self._settings.ingest_job_heartbeat_s)})
        # A fresh context: Ray Serve cancels the replica calls of a request whose client has gone,
        # and this request's response is sent at once.
        task = asyncio.get_running_loop().create_task(
            self._run_ingest_job(request, tenant, collection, inputs, job.id), context=contextvars.Context()
        )
        detach(request, task)
        location = request.scope.get("root_path", "").rstrip("/") + f"{JOBS_PATH}/{job.id}"
        logger.info("ingest job %s for %s/%s: %d documents", job.id, tenant, collection, len(inputs))
        return JSONResponse(job.public(), status_code=202, headers={"Location": location})

    async def _run_ingest_job(
        self, request: Request, tenant: str, collection: str, inputs: list[DocumentInput], job_id: str
    ) -> None:
        jobs = self._ingest_jobs()
        beating = asyncio.ensure_future(_beat(jobs, job_id))

        async def on_progress(progress: IngestProgress) -> None:
            await run_in_threadpool(jobs.progress, job_id, progress.stage, progress.chunks, progress.chunks_embedded)

        try:
            result = await self._ingest(request, tenant, collection, inputs, on_progress)
        except JobCancelled:
            outcome = ("cancelled", None, {"message": "cancelled (DELETE); nothing was stored", "type": "cancelled"})
        except Exception as exc:  # the job's error, as the synchronous ingest would have answered it
            failed = map_exception(exc, self._settings.unavailable_retry_after_s)
            outcome = ("failed", None, {"status": failed.status_code, **json.loads(failed.body)["error"]})
            logger.warning("ingest job %s failed: %r", job_id, exc)
        else:
            outcome = ("completed", result, None)
        finally:
            beating.cancel()
        await run_in_threadpool(jobs.finish, job_id, outcome[0], outcome[1], outcome[2])
        logger.info("ingest job %s %s", job_id, outcome[0])

    # ---- routes ------------------------------------------------------------------------------
    async def get_ingest_job(self, job_id: str, request: Request) -> Response:
        if not is_job_id(job_id):
            raise _not_found(job_id)
        job = await run_in_threadpool(self._ingest_jobs().get, self._tenant(request), job_id)
        if job is None:
            raise _not_found(job_id)
        return JSONResponse(job.public())

    async def list_ingest_jobs(
        self,
        request: Request,
        limit: int | None = Query(
            None,
            ge=1,
            description="Jobs per page (default rag.documents_page_default, at most rag.documents_page_max).",
        ),
        before: str | None = Query(None, max_length=64, description="The last id of the previous page."),
    ) -> Response:
        if before is not None and not is_job_id(before):
            raise HTTPException(
                400,
                f"before {before[:80]!r} is not a job id (ingest_ and 24 hex digits): "
                "pass the last id of the previous page",
            )
        limit = page_limit(limit, self._settings)
        listed = await run_in_threadpool(self._ingest_jobs().list, self._tenant(request), limit + 1, before)
        page = listed[:limit]
        return JSONResponse(
            {
                "object": "list",
                "data": [job.public() for job in page],
                "has_more": len(listed) > limit,
                "last_id": page[-1].id if page else None,
            }
        )

    async def cancel_ingest_job(self, job_id: str, request: Request) -> Response:
        if not is_job_id(job_id):
            raise _not_found(job_id)
        try:
            job = await run_in_threadpool(self._ingest_jobs().request_cancel, self._tenant(request), job_id)
        except NotCancellable as exc:
            raise HTTPException(409, str(exc)) from None
        if job is None:
            raise _not_found(job_id)
        return JSONResponse(job.public(), status_code=202)


async def _beat(jobs: IngestJobStore, job_id: str) -> None:
    """The running job's heartbeat: without it, readers report the job lost."""
    while True:
        await asyncio.sleep(jobs.heartbeat_s)
        try:
            await run_in_threadpool(jobs.heartbeat, job_id)
        except Exception:  # a busy database: the next beat tries again, well inside the lost margin
            logger.exception("ingest job %s: heartbeat not written", job_id)


def _not_found(job_id: str) -> HTTPException:
    return HTTPException(404, f"no ingest job {job_id[:80]!r} for this tenant")


JOB_ENDPOINTS = {
    "list_ingest_jobs": lambda app: app.get(JOBS_PATH),
    "get_ingest_job": lambda app: app.get(JOBS_PATH + "/{job_id}"),
    "cancel_ingest_job": lambda app: app.delete(JOBS_PATH + "/{job_id}"),
}
