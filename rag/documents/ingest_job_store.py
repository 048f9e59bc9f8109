"""Ingest jobs: an ingest that answers 202 at once and runs on, with its state in SQLite.

Every gateway replica opens the same file (state_dir/ingest_jobs.sqlite3), so a job started on one
replica can be read and cancelled through any other. The replica that runs a job writes its progress
and a heartbeat; a job whose heartbeat stops (its replica died) is reported failed as "lost", and
since an ingest stores all its documents in one transaction at the end, a lost or cancelled job
stored nothing.

Cancellation is cooperative and race-free: DELETE sets `cancel_requested` unless the job has reached
its store step, and the job takes the store step only if `cancel_requested` is still unset (both are
one UPDATE with a WHERE, so exactly one of the two wins).

`synchronous=NORMAL` (system/sqlite.py): a power loss may roll back the last progress writes, which
then read as a lost job; the documents themselves live in the knowledge store, synced on commit.
"""

from __future__ import annotations

import json
import re
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from system.sqlite import connect, transaction

RUNNING = ("in_progress", "cancelling")
FINISHED = ("completed", "failed", "cancelled")
# A job whose heartbeat is older than this many heartbeat intervals lost its replica.
LOST_AFTER_HEARTBEATS = 6
LOST_ERROR = {
    "message": "lost: the gateway replica running this job stopped before it finished; nothing was stored",
    "type": "job_lost",
}
JOB_ID = re.compile(r"ingest_[0-9a-f]{24}")  # what create() makes: anything else names no job


def is_job_id(text: str) -> bool:
    return JOB_ID.fullmatch(text) is not None


_SCHEMA = """
CREATE TABLE IF NOT EXISTS ingest_jobs (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    collection TEXT NOT NULL,
    status TEXT NOT NULL,
    stage TEXT NOT NULL,
    documents INTEGER NOT NULL,
    chunks INTEGER NOT NULL DEFAULT 0,
    chunks_embedded INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    heartbeat_at REAL NOT NULL,
    finished_at REAL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    result TEXT,
    error TEXT
);
CREATE INDEX IF NOT EXISTS ingest_jobs_by_tenant ON ingest_jobs (tenant, created_at);
"""
_COLUMNS = (
    "id",
    "tenant",
    "collection",
    "status",
    "stage",
    "documents",
    "chunks",
    "chunks_embedded",
    "created_at",
    "heartbeat_at",
    "finished_at",
    "result",
    "error",
)


class JobCancelled(Exception):
    """Raised inside a job's ingest at its next step after a DELETE: nothing is stored."""


class TooManyJobs(Exception):
    def __init__(self, running: int, limit: int):
        super().__init__(
            f"{running} ingest jobs are running for this tenant; the limit is {limit} "
            "(rag.max_ingest_jobs_per_tenant): wait for one to finish or cancel one"
        )


class NotCancellable(Exception):
    """The job has finished, or is storing its documents (past the point where cancelling is clean)."""


@dataclass(frozen=True)
class Job:
    id: str
    tenant: str
    collection: str
    status: str
    stage: str
    documents: int
    chunks: int
    chunks_embedded: int
    created_at: float
    heartbeat_at: float
    finished_at: float | None
    result: dict | None
    error: dict | None

    def public(self) -> dict:
        """The job as the API shows it (its tenant is the caller: not repeated)."""
        return {
            "id": self.id,
            "object": "ingest.job",
            "collection": self.collection,
            "status": self.status,
            "stage": self.stage,
            "created_at": int(self.created_at),
            "finished_at": None if self.finished_at is None else int(self.finished_at),
            "counts": {"documents": self.documents, "chunks": self.chunks, "chunks_embedded": self.chunks_embedded},
            "result": self.result,
            "error": self.error,
        }


class IngestJobStore:
    def __init__(self, path: str | Path, heartbeat_s: float, retention_s: float):
        self.heartbeat_s, self.retention_s = heartbeat_s, retention_s
        self._db = connect(path, synchronous="NORMAL")
        self._lock = threading.Lock()  # one connection, shared by the gateway's threads
        with self._lock:
            self._db.executescript(_SCHEMA)

    # ---- the API's side --------------------------------------------------------------------
    def create(self, tenant: str, collection: str, documents: int, limit: int, now: float | None = None) -> Job:
        """A new in-progress job, or TooManyJobs when the tenant already runs `limit` of them. Finished
        jobs older than the retention are forgotten here."""
        now = time.time() if now is None else now
        job_id = "ingest_" + secrets.token_hex(12)  # JOB_ID
        with self._lock, transaction(self._db):
            self._db.execute(
                "DELETE FROM ingest_jobs WHERE finished_at IS NOT NULL AND finished_at < ?", (now - self.retention_s,)
            )
            self._mark_lost(now, tenant)
            running = self._db.execute(
                f"SELECT COUNT(*) FROM ingest_jobs WHERE tenant = ? AND status IN {RUNNING}", (tenant,)
            ).fetchone()[0]
            if running >= limit:
                raise TooManyJobs(running, limit)
            self._db.execute(
                "INSERT INTO ingest_jobs (id, tenant, collection, status, stage, documents, created_at, heartbeat_at)"
                " VALUES (?, ?, ?, 'in_progress', 'queued', ?, ?, ?)",
                (job_id, tenant, collection, documents, now, now),
            )
        return self.get(tenant, job_id, now)

    def get(self, tenant: str, job_id: str, now: float | None = None) -> Job | None:
        """The tenant's job, or None (another tenant's job is not found either). A read writes nothing:
        a lost job is shown failed here and marked so by the tenant's next create()."""
        with self._lock:
            row = self._db.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM ingest_jobs WHERE id = ? AND tenant = ?", (job_id, tenant)
            ).fetchone()
        return self._job(row, now) if row else None

    def list(self, tenant: str, limit: int, before: str | None = None, now: float | None = None) -> list[Job]:
        """The tenant's jobs, newest first; `before` is the id that ended the previous page."""
        with self._lock:
            if before is None:
                rows = self._db.execute(
                    f"SELECT {', '.join(_COLUMNS)} FROM ingest_jobs WHERE tenant = ? "
                    "ORDER BY created_at DESC, id DESC LIMIT ?",
                    (tenant, limit),
                ).fetchall()
            else:
                rows = self._db.execute(
                    f"SELECT {', '.join(_COLUMNS)} FROM ingest_jobs WHERE tenant = ? AND (created_at, id) < "
                    "(SELECT created_at, id FROM ingest_jobs WHERE id = ? AND tenant = ?) "
                    "ORDER BY created_at DESC, id DESC LIMIT ?",
                    (tenant, before, tenant, limit),
                ).fetchall()
        return [self._job(row, now) for row in rows]

    def request_cancel(self, tenant: str, job_id: str) -> Job | None:
        """Ask a running job to stop (it does at its next step, storing nothing). None if not found;
        NotCancellable if it finished or is already storing."""
        with self._lock, transaction(self._db):
            changed = self._db.execute(
                "UPDATE ingest_jobs SET cancel_requested = 1, status = 'cancelling' WHERE id = ? AND tenant = ? "
                "AND status = 'in_progress' AND stage != 'storing'",
                (job_id, tenant),
            ).rowcount
        job = self.get(tenant, job_id)
        if job is None or changed or job.status == "cancelling":
            return job
        if job.stage == "storing" and job.status == "in_progress":
            raise NotCancellable(
                f"job {job_id} is storing its documents and can no longer be cancelled; "
                "delete the documents once it has completed"
            )
        raise NotCancellable(f"job {job_id} is {job.status}; there is nothing to cancel")

    # ---- the running job's side ------------------------------------------------------------
    def progress(self, job_id: str, stage: str, chunks: int, chunks_embedded: int) -> None:
        """Record a step, or raise JobCancelled if a cancel was asked for. Entering the "storing" stage
        is the last point a cancel applies: after it the documents are stored."""
        with self._lock, transaction(self._db):
            changed = self._db.execute(
                "UPDATE ingest_jobs SET stage = ?, chunks = ?, chunks_embedded = ?, heartbeat_at = ? "
                "WHERE id = ? AND cancel_requested = 0",
                (stage, chunks, chunks_embedded, time.time(), job_id),
            ).rowcount
        if not changed:
            raise JobCancelled(job_id)

    def heartbeat(self, job_id: str) -> None:
        with self._lock, transaction(self._db):
            self._db.execute("UPDATE ingest_jobs SET heartbeat_at = ? WHERE id = ?", (time.time(), job_id))

    def finish(self, job_id: str, status: str, result: dict | None = None, error: dict | None = None) -> None:
        if status not in FINISHED:
            raise ValueError(f"a job finishes as one of {FINISHED}, not {status!r}")
        with self._lock, transaction(self._db):
            self._db.execute(
                "UPDATE ingest_jobs SET status = ?, stage = ?, finished_at = ?, result = ?, error = ? WHERE id = ?",
                (
                    status,
                    "done" if status == "completed" else status,
                    time.time(),
                    None if result is None else json.dumps(result),
                    None if error is None else json.dumps(error),
                    job_id,
                ),
            )

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ---- internals -------------------------------------------------------------------------
    @property
    def _lost_after_s(self) -> float:
        return LOST_AFTER_HEARTBEATS * self.heartbeat_s

    def _mark_lost(self, now: float, tenant: str) -> None:
        """Running jobs of `tenant` whose replica stopped beating: failed, with the reason, finished at
        the moment they were lost (inside the caller's transaction)."""
        self._db.execute(
            f"UPDATE ingest_jobs SET status = 'failed', stage = 'failed', finished_at = heartbeat_at + ?, error = ? "
            f"WHERE tenant = ? AND status IN {RUNNING} AND heartbeat_at < ?",
            (self._lost_after_s, json.dumps(LOST_ERROR), tenant, now - self._lost_after_s),
        )

    def _job(self, row, now: float | None) -> Job:
        """A row as a Job; a running one whose heartbeat stopped reads as what _mark_lost will make it."""
        values = dict(zip(_COLUMNS, row))
        for key in ("result", "error"):
            values[key] = None if values[key] is None else json.loads(values[key])
        now = time.time() if now is None else now
        if values["status"] in RUNNING and values["heartbeat_at"] < now - self._lost_after_s:
            values.update(
                status="failed",
                stage="failed",
                finished_at=values["heartbeat_at"] + self._lost_after_s,
                error=LOST_ERROR,
            )
        return Job(**values)
