"""RequestBodyGuard: size limit (413) and strict JSON (400) as OpenAI-shaped errors; good bodies replayed intact."""

from __future__ import annotations

import asyncio
import random
import json

import pytest
from fastapi import FastAPI, Request
from pydantic import BaseModel
from starlette.responses import Response
from starlette.testclient import TestClient

from gateway.middleware.request_guard import RequestBodyGuard, _find_problem, validate_json

LIMIT = 2 * 1024 * 1024


class Item(BaseModel):
    name: str


def _client(limit: int = LIMIT, depth: int = 32) -> tuple[TestClient, list[bytes]]:
    """A tiny app behind the guard; `seen` collects the raw bodies the handlers received."""
    seen: list[bytes] = []
    app = FastAPI()

    @app.post("/typed")
    async def typed(item: Item):
        return {"name": item.name}

    @app.api_route("/{path:path}", methods=["POST", "PUT", "PATCH", "GET", "DELETE"])
    async def echo(request: Request):
        body = await request.body()
        seen.append(body)
        return Response(body, media_type="application/octet-stream")

    app.add_middleware(RequestBodyGuard, max_body_bytes=limit, max_json_depth=depth)
    return TestClient(app), seen


def _error(response, status: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["object"] == "error" and body["error"]["code"] == status
    assert body["error"]["type"] == "invalid_request_error"
    return body["error"]["message"]


JSON = {"content-type": "application/json"}


@pytest.mark.parametrize(
    "raw, message",
    [
        (
            b'{"documents": [{"metadata": {"score": NaN}}]}',
            "documents[0].metadata.score: NaN is not a valid JSON number",
        ),
        (b'{"a": [1, Infinity]}', "a[1]: Infinity is not a valid JSON number"),
        (b'{"a": {"b": -Infinity}}', "a.b: -Infinity is not a valid JSON number"),
        (b"NaN", "body: NaN is not a valid JSON number"),
        (b'{"x": [0.5, 1e400]}', "x[1]: number is too large to be a finite float (it parses to inf)"),
        (b'{"x": -1e400}', "x: number is too large to be a finite float (it parses to -inf)"),
        (
            b'{"messages": [{"content": "\\ud800 x"}]}',
            "messages[0].content: contains a lone UTF-16 surrogate (\\ud800); text must be valid Unicode",
        ),
        (
            b'{"m": {"\\udfff": 1}}',
            'm["\\udfff"]: contains a lone UTF-16 surrogate (\\udfff); text must be valid Unicode',
        ),
        (
            b'["ok \\ud83d\\ude00", "\\ude00"]',
            "[1]: contains a lone UTF-16 surrogate (\\ude00); text must be valid Unicode",
        ),
        (b'{"odd key": {"k": NaN}}', '["odd key"].k: NaN is not a valid JSON number'),
    ],
)
def test_json_that_python_accepts_but_json_does_not_is_a_400_naming_the_field(raw, message):
    client, seen = _client()
    assert _error(client.post("/v1/anything", content=raw, headers=JSON), 400) == message
    assert seen == []


def test_invalid_utf8_names_the_byte_offset():
    client, seen = _client()
    message = _error(client.post("/x", content=b'{"a": "caf\xc3"}', headers=JSON), 400)
    assert message == "request body is not valid UTF-8 at byte offset 10"
    assert seen == []


@pytest.mark.parametrize("raw", [b'{"a": 1', b"{'a': 1}", b'{"a": 1} x', b"   ", b'{"a": "tab\there"}'])
def test_invalid_json_is_a_400_with_line_and_column(raw):
    client, _ = _client()
    message = _error(client.post("/x", content=raw, headers=JSON), 400)
    assert message.startswith("request body is not valid JSON: ") and "line 1 column" in message


def test_an_integer_over_pythons_digit_limit_is_a_400_not_a_500():
    client, _ = _client()
    message = _error(client.post("/x", content=b'{"n": ' + b"9" * 5000 + b"}", headers=JSON), 400)
    assert message.startswith("request body is not valid JSON: Exceeds the limit") and "sys." not in message


def test_nesting_beyond_the_limit_names_the_path():
    client, _ = _client(depth=3)
    assert _client(depth=3)[0].post("/x", json={"a": [{"b": 1}]}).status_code == 200
    message = _error(client.post("/x", json={"a": [{"b": [1]}]}), 400)
    assert message == "a[0].b: nesting is deeper than 3 levels (max_json_depth)"


@pytest.mark.parametrize("depth", [33, 1000, 100_000])
def test_pathological_nesting_is_a_400_not_a_crash(depth):
    client, seen = _client()
    message = _error(client.post("/x", content=b"[" * depth + b"]" * depth, headers=JSON), 400)
    assert "nesting is deeper than 32 levels" in message and seen == []
    deep_object = b'{"a":' * depth + b"1" + b"}" * depth
    assert "nesting is deeper than 32 levels" in _error(client.post("/x", content=deep_object, headers=JSON), 400)


def test_good_bodies_reach_the_handler_byte_for_byte():
    client, seen = _client()
    bodies = [
        json.dumps(
            {"text": "naïve café ✓ 😀 \u2028", "n": [1, 2.5, -0.0, 1e308, None, True]}, ensure_ascii=False
        ).encode(),
        json.dumps({"text": "😀 escaped pair"}).encode(),  # ensure_ascii: a valid \ud83d\ude00 pair
        b'\xef\xbb\xbf{"bom": 1}',  # a UTF-8 BOM, which Starlette's request.json() accepts
        b'  {"spaced" :\n [ 1 ,2 ] }  ',
        json.dumps(
            {
                "documents": [
                    {"id": str(i), "text": "lorem ipsum " * 8, "metadata": {"i": i, "x": i / 7}} for i in range(7000)
                ]
            }
        ).encode(),  # about 1 MB
        json.dumps({"input": list(range(150_000))}).encode(),  # about 1 MB of token ids
    ]
    assert len(bodies[4]) > 1_000_000
    for body in bodies:
        response = client.post("/v1/embeddings", content=body, headers=JSON)
        assert response.status_code == 200 and response.content == body
    assert seen == bodies


def test_fastapi_still_parses_the_replayed_body():
    client, _ = _client()
    assert client.post("/typed", json={"name": "ok"}).json() == {"name": "ok"}
    response = client.post("/typed", json={"name": 3})
    assert response.status_code == 422  # validation is still FastAPI's


def test_non_json_bodies_pass_with_only_the_size_limit():
    client, seen = _client(limit=100)
    for content_type in ("text/plain", "multipart/form-data; boundary=x", "application/octet-stream"):
        assert (
            client.post("/up", content=b"NaN \xff not json", headers={"content-type": content_type}).status_code == 200
        )
    assert seen == [b"NaN \xff not json"] * 3
    assert _error(client.post("/up", content=b"x" * 101, headers={"content-type": "text/plain"}), 413)


@pytest.mark.parametrize(
    "content_type", [None, "application/json; charset=utf-8", "application/vnd.api+json", "APPLICATION/JSON"]
)
def test_json_and_absent_content_types_are_validated(content_type):
    client, _ = _client()
    headers = {"content-type": content_type} if content_type else {}
    assert client.post("/x", content=b"[NaN]", headers=headers).status_code == 400


def test_empty_bodies_and_gets_pass():
    client, seen = _client()
    assert client.get("/v1/models").status_code == 200
    assert client.post("/x", content=b"", headers=JSON).status_code == 200
    assert client.delete("/v1/collections/a").status_code == 200
    assert seen == [b"", b"", b""]


def test_declared_content_length_over_the_limit_is_a_413_json():
    client, seen = _client(limit=1000)
    message = _error(client.post("/x", content=b"1" * 1001, headers=JSON), 413)
    assert message == "request body is 1001 bytes; the limit is 1000 (gateway.max_body_bytes)"
    assert client.post("/x", content=b"1" * 1000, headers=JSON).status_code == 200
    assert seen == [b"1" * 1000]


def test_chunked_body_without_content_length_over_the_limit_is_a_413_json():
    client, seen = _client(limit=1000)
    response = client.post("/x", content=iter([b"1" * 600, b"1" * 600]), headers=JSON)
    assert "transfer-encoding" in response.request.headers and "content-length" not in response.request.headers
    assert _error(response, 413).startswith("request body is at least 1200 bytes; the limit is 1000")
    assert seen == []


def test_malformed_content_length_is_a_400():
    client, _ = _client()
    assert _error(client.post("/x", content=b"{}", headers={"content-length": "2x"}), 400).startswith(
        "Content-Length header"
    )


def _drive(guard_factory, messages: list[dict], headers: list[tuple[bytes, bytes]]):
    """Call the middleware directly with hand-made receive messages (Content-Length lies, chunks)."""
    got: dict = {"app_messages": [], "sent": []}

    async def app(scope, receive, send):
        got["app_messages"].append(await receive())
        got["app_messages"].append(await receive())
        await Response(b"ok")(scope, receive, send)

    async def run():
        queue = list(messages)

        async def receive():
            return queue.pop(0) if queue else {"type": "http.disconnect"}

        async def send(message):
            got["sent"].append(message)

        scope = {"type": "http", "method": "POST", "path": "/p", "headers": headers, "query_string": b""}
        await guard_factory(app)(scope, receive, send)

    asyncio.run(run())
    return got


def test_a_content_length_that_lies_is_still_limited_while_reading():
    messages = [{"type": "http.request", "body": b"[1,", "more_body": True}] * 400
    got = _drive(
        lambda app: RequestBodyGuard(app, max_body_bytes=1000),
        messages,
        [(b"content-length", b"10"), (b"content-type", b"application/json")],
    )
    assert got["app_messages"] == []
    start, body = got["sent"][0], got["sent"][1]
    assert start["status"] == 413 and (b"content-type", b"application/json") in start["headers"]
    assert json.loads(body["body"])["error"]["message"] == (
        "request body is at least 1002 bytes; the limit is 1000 (gateway.max_body_bytes)"
    )


def test_chunks_are_replayed_as_one_body_then_later_messages_pass_through():
    messages = [
        {"type": "http.request", "body": b'{"a": ', "more_body": True},
        {"type": "http.request", "body": b'"\xc3\xa9"}', "more_body": False},
        {"type": "http.disconnect"},
    ]
    got = _drive(lambda app: RequestBodyGuard(app, max_body_bytes=1000), messages, [])
    assert got["app_messages"] == [
        {"type": "http.request", "body": '{"a": "é"}'.encode(), "more_body": False},
        {"type": "http.disconnect"},
    ]
    assert got["sent"][0]["status"] == 200


def test_a_client_that_disconnects_mid_body_gets_no_answer_and_the_app_is_not_called():
    got = _drive(
        lambda app: RequestBodyGuard(app, max_body_bytes=1000),
        [{"type": "http.request", "body": b"{", "more_body": True}, {"type": "http.disconnect"}],
        [],
    )
    assert got == {"app_messages": [], "sent": []}


def test_lifespan_and_websocket_scopes_pass_through():
    called = []

    async def app(scope, receive, send):
        called.append(scope["type"])

    asyncio.run(RequestBodyGuard(app, max_body_bytes=1)({"type": "lifespan"}, None, None))
    assert called == ["lifespan"]


def test_validate_json_directly():
    assert validate_json(b'{"ok": [1, 2.5, "x", null, true, {"y": []}]}', 32) is None
    assert validate_json(b"[[[]]]", 2) == "[0][0]: nesting is deeper than 2 levels (max_json_depth)"
    assert (
        validate_json(b'"\\ud800"', 32)
        == "body: contains a lone UTF-16 surrogate (\\ud800); text must be valid Unicode"
    )
    assert (
        validate_json(b'[{"a": {"c": NaN}}, {"b": NaN}]', 32) == "[0].a.c: NaN is not a valid JSON number"
    )  # document order


@pytest.mark.parametrize(
    "raw",
    [
        b'{"t": "[[[[[{{{{{ \\" ]]]] \\\\", "u": ["]]]", "[[["]}',  # brackets in strings are not nesting
        b'{"t": "\\\\\\"[[[[[[", "v": [[1]]}',  # escaped backslash then escaped quote, still inside the string
        b'{"n": [1e100, 1E+300, 1.5e-400, 12345678901234567890], "s": "file1234 e+999 1e400"}',  # look like overflow
        b'{"s": "\\\\ud800 is text, not an escape", "emoji": "\\ud83d\\ude00", "k\\ud83d\\ude00": 1}',
    ],
)
def test_clean_bodies_that_resemble_problems_pass(raw):
    assert validate_json(raw, 3) is None


@pytest.mark.parametrize(
    "raw, message",
    [
        (b'["\\ud83d\\\\\\ude00"]', "[0]: contains a lone UTF-16 surrogate (\\ud83d); text must be valid Unicode"),
        (
            b'{"a": "x", "b": "\\ud83d\\ud83d\\ude00"}',
            "b: contains a lone UTF-16 surrogate (\\ud83d); text must be valid Unicode",
        ),
        (b'{"t": "]]]]", "v": [[[[1]]]]}', "v[0][0]: nesting is deeper than 3 levels (max_json_depth)"),
        (b'{"n": ' + b"1" * 310 + b".5}", "n: number is too large to be a finite float (it parses to inf)"),
    ],
)
def test_problems_hidden_among_lookalikes_are_found(raw, message):
    assert validate_json(raw, 3) == message


def test_the_fast_scans_agree_with_the_full_walk_on_random_lookalike_bodies():
    """The C-speed scans may only skip the walk when the walk would find nothing."""
    rnd = random.Random(7)
    pieces = ["[", "]", "{", "}", '"', "\\", "e123", "é", "😀", " ", "\\ud83d", "\\ude00"]

    def string() -> str:  # pieces JSON-escaped, except the raw \\u escapes that may pair up or not
        return (
            '"'
            + "".join(
                p if p.startswith("\\u") else json.dumps(p, ensure_ascii=rnd.random() < 0.5)[1:-1]
                for p in rnd.choices(pieces, k=rnd.randint(0, 5))
            )
            + '"'
        )

    def value(depth: int) -> str:
        roll = rnd.random()
        if depth > 6 or roll < 0.4:
            return rnd.choice([string(), "1", "-0.5", "1e100", "1E+400", "-1e400", "1" * 250 + "e99", "3e-999", "true"])
        if roll < 0.7:
            return "[" + ",".join(value(depth + 1) for _ in range(rnd.randint(0, 3))) + "]"
        return "{" + ",".join(f"{string()}:{value(depth + 1)}" for _ in range(rnd.randint(0, 3))) + "}"

    outcomes = set()
    for _ in range(3000):
        body = value(0).encode()
        doc = json.loads(body)
        for depth in (2, 5):
            expected = _find_problem(doc, depth, check_text=True)
            assert validate_json(body, depth) == expected, body
            outcomes.add(None if expected is None else expected.split(": ", 1)[1][:12])
    assert len(outcomes) >= 4  # clean bodies, too deep, lone surrogates and overflows all occurred
