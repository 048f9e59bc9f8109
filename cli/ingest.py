"""`poolserve ingest`: one ingest per file, with a rich progress bar (files, chunks, chunks/s). A file
that fails is reported and the rest go on; a file whose content hash the collection already holds
under the same document id is skipped.

Files under JOB_MIN_BYTES are streamed (NDJSON progress on the open request). Larger ones go as ingest
jobs ("async": true, gateway/routes/ingest_jobs.py) followed by polling, so no request has to stay open
for the whole ingest (the gateway's request timeout); Ctrl-C cancels the running job on the server."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import quote

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import base64

from cli.client import ClientError, StackClient
from cli.files import (
    CONTENT_TYPES,
    HASH_KEY,
    SENT_AS_BYTES,
    SOURCE_KEY,
    SourceFile,
    content_hash,
    document_id,
    unchanged,
)


# Larger files are sent as jobs: a 1 MiB file is thousands of chunks, minutes of embedding on a CPU.
JOB_MIN_BYTES = 1 << 20
JOB_POLL_S = 1.0
JOB_WAIT_S = 6 * 3600.0  # a job still running after this is reported, not waited for forever


@dataclass
class IngestReport:
    sent: int = 0
    skipped: int = 0
    chunks: int = 0
    seconds: float = 0.0
    failed: list[tuple[str, str]] = field(default_factory=list)

    @property
    def chunks_per_s(self) -> float:
        return self.chunks / self.seconds if self.seconds else 0.0


def stored_metadata(client: StackClient, collection: str) -> dict[str, dict]:
    """Document id -> metadata of what the collection holds now (empty for a new collection), page by page."""
    stored, params = {}, {}
    while True:
        page = client.request(
            "GET", f"/v1/collections/{quote(collection, safe='')}/documents", ok_missing=True, params=params
        )
        if page is None:
            return stored
        stored.update((doc["id"], doc.get("metadata") or {}) for doc in page["data"])
        if not page["has_more"]:
            return stored
        params = {"after": page["last_id"]}


def ingest_files(
    client: StackClient,
    collection: str,
    files: list[SourceFile],
    console: Console,
    stored: dict[str, dict] | None = None,
    job_min_bytes: int = JOB_MIN_BYTES,
) -> IngestReport:
    """Send each file (skipping those `stored`, the collection's documents, holds unchanged); files of
    `job_min_bytes` and more as ingest jobs."""
    if stored is None:
        stored = stored_metadata(client, collection)  # also a 400 for a malformed name, before any file
    report, started = IngestReport(), time.perf_counter()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("files"),
        TextColumn("{task.fields[chunks]} chunks"),
        TextColumn("{task.fields[rate]:.1f} chunks/s"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(f"ingest into {collection}", total=len(files), chunks=0, rate=0.0)

        def show(extra_chunks: int = 0) -> None:
            done = report.chunks + extra_chunks
            progress.update(task, chunks=done, rate=done / max(1e-9, time.perf_counter() - started))

        for source in files:
            problem = _ingest_one(client, collection, source, stored, report, show, job_min_bytes)
            if problem:
                report.failed.append((source.source, problem))
                progress.console.print(f"[red]failed[/red] {source.source}: {problem}")
            report.seconds = time.perf_counter() - started
            show()
            progress.advance(task)
    return report


def _ingest_one(
    client: StackClient,
    collection: str,
    source: SourceFile,
    stored: dict,
    report: IngestReport,
    show,
    job_min_bytes: int = JOB_MIN_BYTES,
) -> str | None:
    """Send one file; None when it was stored or skipped, else why it failed."""
    if source.content_type is None:
        return (
            f"unsupported file type {source.path.suffix or '(none)'!r}; supported: {', '.join(sorted(CONTENT_TYPES))}"
        )
    try:
        data = source.path.read_bytes()
    except OSError as exc:
        return f"cannot read it: {exc.strerror}"
    doc_id, digest = document_id(source.source), content_hash(data)
    if unchanged(doc_id, digest, stored):
        report.skipped += 1
        return None
    document = {
        "id": doc_id,
        "content_type": source.content_type,
        "metadata": {SOURCE_KEY: source.source, HASH_KEY: digest},
    }
    if source.path.suffix.lower() in SENT_AS_BYTES:
        document["data_base64"] = base64.b64encode(data).decode("ascii")
    else:
        try:
            document["text"] = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return f"not UTF-8 text (byte {exc.start})"
    path = f"/v1/collections/{quote(collection, safe='')}/documents"
    if len(data) >= job_min_bytes:
        return _ingest_as_job(client, path, document, report, show)
    try:
        for event in client.stream_lines(path, {"documents": [document], "stream": True}):
            if event.get("event") == "progress":
                show(event.get("chunks_embedded", 0))
            elif event.get("event") == "done":
                report.sent += 1
                report.chunks += event["chunks"]
                return None
            elif event.get("event") == "error":
                return f"{event.get('status')}: {(event.get('error') or {}).get('message', event)}"
    except ClientError as exc:
        return str(exc)
    return "the stream ended without a result"


def _ingest_as_job(
    client: StackClient,
    path: str,
    document: dict,
    report: IngestReport,
    show,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str | None:
    """Start an ingest job and follow it to its end; Ctrl-C cancels it on the server, then stops."""
    try:
        job = client.request("POST", path, json={"documents": [document], "async": True})
    except ClientError as exc:
        return str(exc)
    deadline = clock() + JOB_WAIT_S
    try:
        while job["status"] in ("in_progress", "cancelling"):
            if clock() > deadline:
                return (
                    f"job {job['id']} is still {job['status']} after {JOB_WAIT_S:.0f}s; GET /v1/ingest/jobs/{job['id']}"
                )
            show(job["counts"]["chunks_embedded"])
            sleep(JOB_POLL_S)
            job = client.request("GET", f"/v1/ingest/jobs/{job['id']}")
    except KeyboardInterrupt:
        try:
            client.request("DELETE", f"/v1/ingest/jobs/{job['id']}")
        except ClientError:
            pass  # it finished (409) or the stack is gone: nothing left to cancel
        raise
    except ClientError as exc:
        return f"job {job['id']}: {exc}"
    if job["status"] == "completed":
        report.sent += 1
        report.chunks += job["result"]["chunks"]
        return None
    error = job.get("error") or {}
    return f"job {job['id']} {job['status']}: {error.get('status', '')} {error.get('message', '')}".strip()
