"""What `poolserve ingest` sends (pure): the files under the given paths, their document ids, content
types and content hashes, and which of them the collection already holds unchanged."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

# File suffix -> the content_type the ingest route extracts text from (rag/documents/extract.py).
CONTENT_TYPES = {
    ".txt": "text/plain",
    ".text": "text/plain",
    ".md": "text/markdown",
    ".markdown": "text/markdown",
    ".html": "text/html",
    ".htm": "text/html",
    ".xhtml": "application/xhtml+xml",
    ".pdf": "application/pdf",
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ".pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
}
# Sent as the file's bytes (data_base64): binary formats, and HTML so its declared charset is honoured.
SENT_AS_BYTES = {".html", ".htm", ".xhtml", ".pdf", ".docx", ".pptx"}
HASH_KEY = "sha256"  # the document metadata key that holds the file's content hash
SOURCE_KEY = "source"  # ... and the file's path as given (relative to the argument's parent)
MAX_ID_LEN = 128  # rag/documents/ids.py's document id limit
_NOT_IN_ID = re.compile(r"[^A-Za-z0-9_.:@-]")


@dataclass(frozen=True)
class SourceFile:
    path: Path
    source: str  # "docs/guide.md": the path relative to the parent of the argument it was found under
    content_type: str | None  # None: a type the server cannot extract (reported, not sent)


def walk(arguments: list[Path]) -> tuple[list[SourceFile], list[Path]]:
    """Files to ingest, in a stable order, and the paths that do not exist. A folder is walked
    recursively, skipping hidden entries and files of other types; a file named directly is always
    listed (with content_type None when its type is not supported, so it is reported)."""
    found: dict[Path, SourceFile] = {}
    missing = []
    for argument in arguments:
        if argument.is_dir():
            for path in sorted(argument.rglob("*")):
                relative = path.relative_to(argument)
                if (
                    path.is_file()
                    and not any(part.startswith(".") for part in relative.parts)
                    and path.suffix.lower() in CONTENT_TYPES
                ):
                    found.setdefault(path.resolve(), _source(path, argument.resolve().parent))
        elif argument.is_file():
            found.setdefault(argument.resolve(), _source(argument, argument.resolve().parent))
        else:
            missing.append(argument)
    return list(found.values()), missing


def _source(path: Path, base: Path) -> SourceFile:
    return SourceFile(path, path.resolve().relative_to(base).as_posix(), CONTENT_TYPES.get(path.suffix.lower()))


def document_id(source: str) -> str:
    """A valid document id for a relative path ('/' becomes ':', other characters '_'); an id that
    would be too long keeps its start and ends with a hash of the whole path, so it stays unique."""
    text = _NOT_IN_ID.sub("_", source.replace("/", ":"))
    text = re.sub(r"\.{2,}", ".", text)
    if not text[:1].isalnum():
        text = "f" + text
    if len(text) > MAX_ID_LEN:
        text = text[: MAX_ID_LEN - 17] + "-" + hashlib.sha256(source.encode()).hexdigest()[:16]
    return text


def content_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def unchanged(doc_id: str, digest: str, stored: dict[str, dict]) -> bool:
    """True when the collection holds this document id with the same content hash in its metadata."""
    return (stored.get(doc_id) or {}).get(HASH_KEY) == digest
