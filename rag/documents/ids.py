"""Validation of client-supplied names: collections and document ids never reach a path."""

from __future__ import annotations

import re

MAX_COLLECTION_LEN = 64
MAX_DOCUMENT_ID_LEN = 128
_COLLECTION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_DOCUMENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]*")


class InvalidIdError(ValueError):
    """A collection name or document id is malformed; the message names the problem."""


def _check(kind: str, value: object, pattern: re.Pattern, max_len: int) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidIdError(f"{kind} must be a non-empty string")
    if len(value) > max_len:
        raise InvalidIdError(f"{kind} is {len(value)} characters long; the limit is {max_len}")
    if "/" in value or "\\" in value or ".." in value or "\x00" in value:
        raise InvalidIdError(f"{kind} {value[:40]!r} contains path characters ('/', '\\\\', '..' or NUL)")
    if not pattern.fullmatch(value):
        raise InvalidIdError(
            f"{kind} {value[:40]!r} is invalid: use letters, digits and '_', '-', '.'"
            + (", ':', '@'" if kind == "document id" else "")
            + ", starting with a letter or digit"
        )
    return value


def validate_collection(name: object) -> str:
    return _check("collection name", name, _COLLECTION, MAX_COLLECTION_LEN)


def validate_document_id(doc_id: object) -> str:
    return _check("document id", doc_id, _DOCUMENT_ID, MAX_DOCUMENT_ID_LEN)
