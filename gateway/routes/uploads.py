"""The ingest route's two body shapes, as one AddDocumentsRequest.

- application/json: AddDocumentsRequest, a document's bytes base64 in `data_base64`;
- multipart/form-data: one `file` part per document (its part Content-Type, or its name's suffix when
  that is application/octet-stream, says the format), optional `id` fields (one per file, in order;
  default: the file's name), an optional `metadata` field (a JSON object given to every file) and an
  optional `stream` or `async` field ("true": NDJSON progress, or a job answered 202).
"""

from __future__ import annotations

import base64
import json
from pathlib import PurePosixPath

from fastapi import HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from gateway.schemas import AddDocumentsRequest
from rag.documents.binary_files import DOCX, PDF, PPTX

MULTIPART = "multipart/form-data"
# A part sent as application/octet-stream (curl -F file=@x.pdf does) is typed by its name.
SUFFIX_TYPES = {
    ".pdf": PDF,
    ".docx": DOCX,
    ".pptx": PPTX,
    ".html": "text/html",
    ".htm": "text/html",
    ".xhtml": "application/xhtml+xml",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".txt": "text/plain",
}
# Bytes of content type values that name no format of their own.
GENERIC_TYPES = ("application/octet-stream", "")
DOCUMENT_ID_CHARS = "".join(chr(c) for c in range(128) if chr(c).isalnum()) + "_.:@-"


async def read_ingest_body(request: Request, max_documents: int) -> AddDocumentsRequest:
    media = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    if media == MULTIPART:
        raw = await _multipart(request, max_documents)
    else:
        try:
            raw = json.loads(await request.body())
        except ValueError as exc:
            raise HTTPException(400, f"request body is not valid JSON: {str(exc)[:200]}") from None
    try:
        return AddDocumentsRequest.model_validate(raw)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False), body=None) from None


def decoded_data(index: int, doc_id: str, data_base64: str, max_bytes: int) -> bytes:
    """A document's data_base64 as bytes: 422 if it is not base64, 413 over the file size limit."""
    if len(data_base64) * 3 // 4 > max_bytes + 2:
        raise HTTPException(
            413,
            f"documents[{index}].data_base64 (id {doc_id!r}) is over the {max_bytes} byte "
            "file limit (rag.extraction.max_document_bytes)",
        )
    try:
        return base64.b64decode(data_base64, validate=True)
    except ValueError:
        raise HTTPException(422, f"documents[{index}].data_base64 (id {doc_id!r}) is not valid base64") from None


async def _multipart(request: Request, max_documents: int) -> dict:
    try:
        form = await request.form(max_files=max_documents, max_fields=max_documents + 8)
    except Exception as exc:  # python-multipart's parse errors and Starlette's too-many-files error
        raise HTTPException(400, f"multipart/form-data body cannot be read: {str(exc)[:200]}") from None
    files = [part for part in form.getlist("file") if isinstance(part, UploadFile)]
    if not files:
        raise HTTPException(400, "a multipart/form-data ingest needs at least one `file` part")
    ids = [str(value) for value in form.getlist("id")]
    if ids and len(ids) != len(files):
        raise HTTPException(400, f"{len(ids)} `id` fields for {len(files)} files; give one per file or none")
    try:
        metadata = json.loads(str(form.get("metadata") or "{}"))
    except ValueError:
        raise HTTPException(400, "the `metadata` field is not valid JSON") from None
    documents = []
    for i, part in enumerate(files):
        name = PurePosixPath(part.filename or f"file-{i}").name
        content_type = (part.content_type or "").split(";", 1)[0].strip().lower()
        if content_type in GENERIC_TYPES:
            content_type = SUFFIX_TYPES.get(
                PurePosixPath(name).suffix.lower(), content_type or "application/octet-stream"
            )
        data = await part.read()
        documents.append(
            {
                "id": ids[i] if ids else _id_from_name(name),
                "content_type": content_type,
                "data_base64": base64.b64encode(data).decode("ascii"),
                "metadata": metadata,
            }
        )
    return {
        "documents": documents,
        "stream": str(form.get("stream") or "").lower() == "true",
        "async": str(form.get("async") or "").lower() == "true",
    }


def _id_from_name(name: str) -> str:
    text = "".join(c if c in DOCUMENT_ID_CHARS else "_" for c in name)
    return text if text[:1].isalnum() else "f" + text


# The route reads its body itself (two shapes), so its OpenAPI entry describes both.
INGEST_OPENAPI = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": AddDocumentsRequest.model_json_schema(ref_template="#/components/schemas/{model}")
            },
            MULTIPART: {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {"type": "array", "items": {"type": "string", "format": "binary"}},
                        "id": {"type": "array", "items": {"type": "string"}},
                        "metadata": {"type": "string", "description": "A JSON object given to every file."},
                        "stream": {"type": "string", "enum": ["true", "false"]},
                        "async": {"type": "string", "enum": ["true", "false"]},
                    },
                }
            },
        },
    }
}
