"""RequestBodyGuard: bounds request bodies and rejects malformed JSON before any handler runs.

Python's json module accepts things JSON does not (NaN, Infinity, numbers that overflow to inf,
lone surrogates) and recurses without bound; each of those would otherwise surface deep inside a
handler or replica as a 500. Here they become OpenAI-shaped 4xx answers naming the field.
"""

from __future__ import annotations

import json
import re

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.http_errors import error_body

# Hints from the raw bytes (a match only means "look closer"): a lone surrogate needs a
# \uD800-\uDFFF escape (UTF-8 cannot carry one); an overflowing float needs 200+ digits or a
# positive exponent of 3+ digits (digits mapped to 0, E to e and '+' dropped make both substrings).
_SURROGATE_HINT = re.compile(rb"\\u[dD][89a-fA-F]")
_NUMBER_SHAPES = bytes.maketrans(b"123456789E", b"000000000e"), b"+"
_BIG_EXPONENT = re.compile(rb"e000")  # sre's literal search is ~4x faster than `in` on digit runs
_ESCAPED_QUOTE_OR_BACKSLASH = re.compile(rb'\\[\\"]')
_QUOTES_AND_BRACKETS = bytes(set(range(256)) - set(b'"[]{}'))  # translate's delete argument
_CURLY_TO_SQUARE = bytes.maketrans(b"{}", b"[]")
_INF = float("inf")
# Scalars that are always fine (str unless the body has a surrogate escape).
_PLAIN = frozenset({int, bool, type(None), float, str})


class _Constant(str):
    """What json.loads makes of NaN, Infinity and -Infinity, so the walk can find them."""


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _path(entry) -> str:
    """Render a walk entry's (parent, key) chain as documents[0].metadata.score."""
    parts = []
    while entry is not None and entry[3] is not None:
        key = entry[3]
        if isinstance(key, int):
            parts.append(f"[{key}]")
        elif key.isidentifier():
            parts.append("." + key)
        else:  # backslashreplace keeps a lone surrogate out of the (UTF-8) error message
            shown = json.dumps(key[:64], ensure_ascii=False).encode("utf-8", "backslashreplace").decode()
            parts.append(f"[{shown}]")
        entry = entry[2]
    return "".join(reversed(parts)).lstrip(".") or "body"


def _text_problem(text: str) -> str | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"contains a lone UTF-16 surrogate (\\u{ord(text[exc.start]):04x}); text must be valid Unicode"
    return None


def _scalar_problem(value, check_text: bool) -> str | None:
    kind = type(value)
    if kind is _Constant:
        return f"{value} is not a valid JSON number"
    if kind is float and value - value != 0:  # only inf is left here: NaN arrives as a _Constant
        return f"number is too large to be a finite float (it parses to {value})"
    if kind is str and check_text:
        return _text_problem(value)
    return None


def _find_problem(doc, max_depth: int, check_text: bool) -> str | None:
    """The first problem in a parsed body as '<path>: <what>', or None. Iterative, so depth is free."""
    if (problem := _scalar_problem(doc, check_text)) is not None:
        return f"body: {problem}"
    stack = [(doc, 1, None, None)] if type(doc) in (dict, list) else []
    while stack:
        entry = stack.pop()
        node, depth = entry[0], entry[1]
        if depth > max_depth:
            return f"{_path(entry)}: nesting is deeper than {max_depth} levels (max_json_depth)"
        kids = node.values() if type(node) is dict else node
        kinds = set(map(type, kids))
        # Containers of plain scalars are cleared at C speed; only the rest is looked at one by one.
        if not (
            kinds - _PLAIN
            or (check_text and (str in kinds or type(node) is dict))
            or (float in kinds and (_INF in kids or -_INF in kids))
        ):
            continue
        children = []
        for key, kid in node.items() if type(node) is dict else enumerate(node):
            if check_text and type(key) is str and (problem := _text_problem(key)):
                return f"{_path((None, 0, entry, key))}: {problem}"
            if type(kid) in (dict, list):
                children.append((kid, depth + 1, entry, key))
            elif (problem := _scalar_problem(kid, check_text)) is not None:
                return f"{_path((None, 0, entry, key))}: {problem}"
        stack.extend(reversed(children))  # so that children are visited in document order
    return None


def _clean(body: bytes, doc, max_depth: int) -> bool:
    """True when C-speed scans show the parsed body holds nothing _find_problem would report, so
    that a clean body (almost every body) is never walked object by object."""
    shapes = body.translate(*_NUMBER_SHAPES)
    if _SURROGATE_HINT.search(body) or _BIG_EXPONENT.search(shapes) or b"0" * 200 in shapes:
        try:  # strict re-encoding fails exactly on inf floats and lone surrogates
            json.dumps(doc, ensure_ascii=False, allow_nan=False).encode("utf-8")
        except (ValueError, RecursionError):
            return False
    # Depth from the brackets outside strings; escapes are masked first so every quote delimits.
    if b"\\" in body:
        body = _ESCAPED_QUOTE_OR_BACKSLASH.sub(b"__", body)
    brackets = b"".join(body.translate(None, _QUOTES_AND_BRACKETS).split(b'"')[::2]).translate(_CURLY_TO_SQUARE)
    for _ in range(max_depth):  # each round drops the innermost containers
        brackets = brackets.replace(b"[]", b"")
    return not brackets


def validate_json(body: bytes, max_depth: int) -> str | None:
    """Why `body` is not strict JSON (RFC 8259) within `max_depth` levels, or None."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"request body is not valid UTF-8 at byte offset {exc.start}"
    if text.startswith("\ufeff"):  # a UTF-8 BOM: Starlette's request.json() accepts it too
        text, body = text[1:], body[3:]
    constants: list[str] = []

    def constant(name: str) -> _Constant:
        constants.append(name)
        return _Constant(name)

    try:
        doc = json.loads(text, parse_constant=constant)
    except RecursionError:
        return f"body: nesting is deeper than {max_depth} levels (max_json_depth)"
    except ValueError as exc:  # JSONDecodeError, or an integer over Python's 4300-digit limit
        return "request body is not valid JSON: " + str(exc).partition("; use sys.")[0]
    if not constants and _clean(body, doc, max_depth):
        return None
    return _find_problem(doc, max_depth, check_text=bool(_SURROGATE_HINT.search(body)))


class RequestBodyGuard:
    """Pure ASGI middleware: a body-size limit (413) and strict JSON validation (400), answered
    with error_body JSON; a body that passes is replayed byte for byte to the wrapped app."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, max_json_depth: int = 32) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_json_depth = max_json_depth

    def _too_large(self, size: int, at_least: bool = False):
        return error_body(
            413,
            f"request body is {'at least ' if at_least else ''}{size} bytes; "
            f"the limit is {self.max_body_bytes} (gateway.max_body_bytes)",
            "invalid_request_error",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        declared = headers.get("content-length")
        if declared is not None:
            if not (declared.strip().isascii() and declared.strip().isdigit()):
                await error_body(
                    400, f"Content-Length header {declared[:40]!r} is not a byte count", "invalid_request_error"
                )(scope, receive, send)
                return
            if int(declared) > self.max_body_bytes:
                await self._too_large(int(declared))(scope, receive, send)
                return

        # Content-Length may lie or be absent (chunked), so the limit is enforced as bytes arrive.
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client is gone; nobody to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._too_large(size, at_least=True)(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)

        if body and _is_json(headers.get("content-type")):
            # Off the event loop: a few MB of pathological JSON takes seconds to walk.
            problem = await run_in_threadpool(validate_json, body, self.max_json_depth)
            if problem is not None:
                await error_body(400, problem, "invalid_request_error")(scope, receive, send)
                return

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # e.g. http.disconnect, which streaming responses wait for

        await self.app(scope, replay, send)
