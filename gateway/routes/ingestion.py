"""The ingest route, POST /v1/collections/{c}/documents, mixed into the gateway (through
gateway/routes/knowledge.py): validate, run rag.retrieval.pipeline.RagPipeline.ingest, answer.

Three ways to answer, all atomic (all documents stored or none) and finished even if the client
hangs up (the work is paid for):
- by default one JSON body once everything is stored: per-document chunk counts, total chunks and
  the tokens embedded (what the tenant is charged);
- with "stream": true, NDJSON (one JSON object a line) as it goes: a "progress" event after chunking
  and after each embedder call (chunks_embedded of chunks: what a progress bar needs), then "done"
  with the same body as the JSON answer, or "error" with the status and error body it would have had;
- with "async": true, 202 and an ingest job at once (gateway/routes/ingest_jobs.py): for ingests longer
  than a request may stay open (gateway.request_timeout_s), followed by GET and cancelled by DELETE.
Each ingest also logs one line with its counts and speed.

Bodies are JSON (a file's bytes base64 in `data_base64`) or multipart/form-data (gateway/routes/uploads.py).
Markdown, HTML, PDF, DOCX and PPTX are extracted in the gateway's capped worker processes
(rag/documents/extract_worker.py); the CPU seconds each document took are charged to the tenant as usage of the
model EXTRACTION_USAGE_MODEL, in milliseconds as prompt tokens (so they count against its TPM too).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time
from typing import AsyncIterator

from fastapi import HTTPException, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from gateway.http_errors import map_exception
from gateway.middleware.tenant_guard import record_usage, reserve_tokens
from gateway.rag_adapters import pipeline_settings
from gateway.rag_adapters import RayEmbedder, RayIndex
from gateway.retriever_calls import RetrieverHandle
from gateway.routes.ingest_jobs import IngestJobRoutes
from gateway.routes.uploads import decoded_data, read_ingest_body
from gateway.schemas import AddDocumentsRequest
from gateway.work import release_heap_after_sending, run_to_completion, wait_out
from planner.profile import ExtractionSpec
from rag.documents.extract import Extracted
from rag.documents.extract_worker import ExtractionFailed, ExtractionLimits, ExtractionPool
from rag.documents.ids import validate_collection, validate_document_id
from rag.retrieval.pipeline import DocumentInput, IngestProgress, IngestTimings, ProgressCallback, RagPipeline
from tenancy.limits import estimate_text_tokens

logger = logging.getLogger("poolserve.ingest")
NDJSON = "application/x-ndjson"
EXTRACTION_USAGE_MODEL = "poolserve/extraction-cpu-ms"


class IngestRoutes(IngestJobRoutes):
    """Needs from the gateway: _embedder, _retriever, _settings, _embed_model_id, _tenant."""

    # Every route of the gateway reads the retriever through this: its refusals (a missing collection, a full
    # quota) are raised here as the client errors they are (gateway/retriever_calls.py).
    _retriever = RetrieverHandle()

    async def add_documents(self, collection: str, request: Request) -> Response:
        validate_collection(collection)
        body = await read_ingest_body(request, self._settings.max_documents_per_request)
        return await self.ingest_body(collection, body, request)

    async def ingest_body(self, collection: str, body: AddDocumentsRequest, request: Request) -> Response:
        """The ingest of a parsed body (JSON or multipart, gateway/routes/uploads.py)."""
        tenant = self._tenant(request)
        self._check_ingest_limits(body)
        max_bytes = self._extraction_spec().max_document_bytes
        inputs = [
            DocumentInput(
                id=doc.id,
                text=doc.text or "",
                metadata=doc.metadata,
                content_type=doc.content_type,
                data=None if doc.data_base64 is None else decoded_data(i, doc.id, doc.data_base64, max_bytes),
            )
            for i, doc in enumerate(body.documents)
        ]
        if body.run_async:
            return await self.start_ingest_job(request, tenant, collection, inputs)
        if body.stream:
            return StreamingResponse(
                self._ingest_events(request, tenant, collection, inputs),
                media_type=NDJSON,
                background=release_heap_after_sending(),
            )
        # The whole ingest finishes even if the client hangs up (it is atomic and it is paid for).
        timings = IngestTimings()
        result = await run_to_completion(self._ingest(request, tenant, collection, inputs, timings=timings))
        return JSONResponse(
            result, headers={"Server-Timing": timings.server_timing()}, background=release_heap_after_sending()
        )

    def _check_ingest_limits(self, body: AddDocumentsRequest) -> None:
        limit = self._settings.max_documents_per_request
        if len(body.documents) > limit:
            raise HTTPException(
                413,
                f"documents has {len(body.documents)} items; the limit is {limit} per request "
                "(rag.max_documents_per_request)",
            )
        ids = [validate_document_id(doc.id) for doc in body.documents]
        if len(set(ids)) != len(ids):
            raise HTTPException(400, "documents[].id repeats within the request; each id may appear once")
        max_chars = self._settings.max_document_chars
        for i, doc in enumerate(body.documents):
            if doc.text is not None and len(doc.text) > max_chars:
                raise HTTPException(
                    413,
                    f"documents[{i}].text (id {doc.id!r}) has {len(doc.text)} characters; the "
                    f"limit is {max_chars} (rag.max_document_chars)",
                )

    async def _ingest(
        self,
        request: Request,
        tenant: str,
        collection: str,
        inputs: list[DocumentInput],
        on_progress: ProgressCallback | None = None,
        timings: IngestTimings | None = None,
    ) -> dict:
        """Extract, chunk and embed everything, then store all documents in one transaction: all or none."""
        embedded = {"tokens": 0}
        timings = timings if timings is not None else IngestTimings()

        async def embed_and_count(texts: list[str]) -> dict:
            result = await self._embed_and_charge(request, texts, timings)
            embedded["tokens"] += result["tokens"]
            return result

        extraction = {"cpu_seconds": 0.0}

        async def extract_and_charge(doc: DocumentInput) -> Extracted:
            try:
                result = await self._extraction_pool().extract(
                    doc.data if doc.data is not None else doc.text, doc.content_type
                )
            except ExtractionFailed as exc:
                await self._charge_extraction(request, exc.cpu_seconds, extraction)
                raise HTTPException(exc.status, f"document {doc.id!r} ({doc.content_type}): {exc}") from None
            await self._charge_extraction(request, result.cpu_seconds, extraction)
            return result.extracted

        pipeline = RagPipeline(
            RayEmbedder(self._embedder, embed_and_count, tenant),
            RayIndex(self._retriever),
            pipeline_settings(self),
            extractor=extract_and_charge,
        )
        started = time.perf_counter()
        counts = await pipeline.ingest(
            tenant, collection, inputs, on_progress, lambda texts: self._reserve_chunks(request, texts), timings
        )
        seconds = time.perf_counter() - started
        chunks = sum(counts)
        logger.info(
            "ingest %s/%s: %d documents, %d chunks, %d tokens, %.2f s extraction CPU in %.1f s (%.1f chunks/s; ms %s)",
            tenant,
            collection,
            len(inputs),
            chunks,
            embedded["tokens"],
            extraction["cpu_seconds"],
            seconds,
            chunks / seconds if seconds else 0.0,
            timings.server_timing(),
        )
        return {
            "collection": collection,
            "documents": [{"id": doc.id, "chunks": n} for doc, n in zip(inputs, counts)],
            "chunks": chunks,
            "tokens": embedded["tokens"],
            "extraction_cpu_seconds": round(extraction["cpu_seconds"], 3),
        }

    async def _reserve_chunks(self, request: Request, texts: list[str]) -> None:
        """Once chunked, before anything is embedded: the chunks' tokens, as the embedder will read them, are
        the ingest's estimate (raised from the one made from its documents' text, or made here for files,
        which had none). Over the whole TPM it is a 429 "Request too large" and nothing is embedded."""
        await reserve_tokens(
            request,
            estimate_text_tokens(texts, self._settings.embed_max_seq_tokens),
            "characters / 4 of each chunk to embed, with its title, at most embed_max_seq_tokens each",
        )

    def _extraction_spec(self) -> ExtractionSpec:
        return self._settings.extraction

    def _extraction_pool(self) -> ExtractionPool:
        """The gateway's extraction workers, started at its first upload that needs one."""
        pool = getattr(self, "_extraction_workers", None)
        if pool is None:
            spec = self._extraction_spec()
            pool = self._extraction_workers = ExtractionPool(
                ExtractionLimits(
                    workers=spec.workers,
                    cpu_seconds=spec.cpu_seconds,
                    memory_bytes=spec.memory_bytes,
                    wall_seconds=spec.wall_seconds,
                    max_locations=spec.max_locations,
                    cpu_nice=spec.cpu_nice,
                )
            )
        return pool

    async def _charge_extraction(self, request: Request, cpu_seconds: float, total: dict) -> None:
        total["cpu_seconds"] += cpu_seconds
        milliseconds = round(cpu_seconds * 1000)
        await record_usage(
            request, EXTRACTION_USAGE_MODEL, {"prompt_tokens": milliseconds, "total_tokens": milliseconds}
        )

    async def _embed_and_charge(self, request: Request, texts: list[str], timings: IngestTimings | None = None) -> dict:
        result = await self._embedder.embed.remote(texts, self._tenant(request))
        charging = time.perf_counter()
        await record_usage(
            request, self._embed_model_id, {"prompt_tokens": result["tokens"], "total_tokens": result["tokens"]}
        )
        if timings is not None:
            timings.charge += time.perf_counter() - charging
            timings.embedder_busy += result.get("busy_s", 0.0)
            timings.embedder_cleanup += result.get("cleanup_s", 0.0)
        return result

    async def _ingest_events(
        self, request: Request, tenant: str, collection: str, inputs: list[DocumentInput]
    ) -> AsyncIterator[bytes]:
        """NDJSON events of one ingest. The ingest runs in its own task (a fresh context, so Ray Serve
        does not cancel its replica calls with the request); if the client leaves, this waits for it
        before letting go, so the tenant's concurrency slot is held until the work is done."""
        events: asyncio.Queue[IngestProgress | None] = asyncio.Queue()
        work = asyncio.get_running_loop().create_task(
            self._ingest(request, tenant, collection, inputs, events.put_nowait), context=contextvars.Context()
        )
        work.add_done_callback(lambda _: events.put_nowait(None))
        try:
            while (progress := await events.get()) is not None:
                yield _line({"event": "progress", **progress.model_dump()})
            if work.exception() is None:
                yield _line({"event": "done", **work.result()})
            else:
                failed = map_exception(work.exception(), self._settings.unavailable_retry_after_s)
                yield _line({"event": "error", "status": failed.status_code, **json.loads(failed.body)})
        finally:
            await wait_out(work)
            if not work.cancelled() and work.exception() is not None:  # also when nobody was left to tell
                logger.warning("ingest %s/%s failed: %r", tenant, collection, work.exception())


def _line(event: dict) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode() + b"\n"
