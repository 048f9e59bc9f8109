"""DocumentIn.metadata bounds: top-level keys, serialized size and nesting depth, each a clear 422."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from pydantic import ValidationError
from starlette.testclient import TestClient

from gateway.http_errors import install_error_handlers
from gateway.schemas import (
    METADATA_MAX_BYTES,
    METADATA_MAX_DEPTH,
    METADATA_MAX_KEYS,
    AddDocumentsRequest,
    DocumentIn,
)


def _doc(metadata) -> DocumentIn:
    return DocumentIn(id="d1", text="some text", metadata=metadata)


def _message(metadata) -> str:
    with pytest.raises(ValidationError) as info:
        _doc(metadata)
    (error,) = info.value.errors()
    assert error["loc"] == ("metadata",)
    return error["msg"]


def test_the_documented_bounds():
    assert (METADATA_MAX_KEYS, METADATA_MAX_BYTES, METADATA_MAX_DEPTH) == (64, 8 * 1024, 4)


def test_metadata_within_every_bound_is_kept_as_is():
    metadata = {f"k{i}": i for i in range(METADATA_MAX_KEYS - 1)}
    metadata["nested"] = {"a": {"b": [1, "x", None, True, 2.5]}}  # depth 4, counting metadata itself
    assert _doc(metadata).metadata == metadata
    assert _doc({}).metadata == {} and DocumentIn(id="d", text="t").metadata == {}


def test_too_many_top_level_keys():
    message = _message({f"k{i}": i for i in range(METADATA_MAX_KEYS + 1)})
    assert message == "Value error, metadata has 65 keys; at most 64 are allowed (METADATA_MAX_KEYS)"


def test_too_large_when_serialized_counts_utf8_bytes():
    assert _doc({"s": "x" * (METADATA_MAX_BYTES - 8)}).metadata  # {"s":"..."} is exactly the limit
    message = _message({"s": "x" * (METADATA_MAX_BYTES - 7)})
    assert message == "Value error, metadata is 8193 bytes as JSON; at most 8192 are allowed (METADATA_MAX_BYTES)"
    assert "is 8196 bytes" in _message({"s": "é" * 4094})  # 2 bytes each in UTF-8


def test_too_deep_names_the_measured_depth():
    assert "metadata nests 5 levels deep; at most 4 are allowed (METADATA_MAX_DEPTH)" in _message({"a": [[{"b": [1]}]]})
    deep: list = []
    for _ in range(5000):  # iterative, so pathological depth is a 422, not a RecursionError
        deep = [deep]
    assert "metadata nests 5002 levels deep" in _message({"a": deep})


def test_keys_must_be_strings_and_values_json():
    with pytest.raises(ValidationError):
        _doc({1: "x"})
    assert "metadata is not valid JSON" in _message({"x": float("nan")})
    assert "metadata is not valid JSON" in _message({"x": "\ud800"})
    assert "metadata is not valid JSON" in _message({"x": {1, 2}})


def test_fastapi_answers_422_naming_the_document():
    app = FastAPI()
    install_error_handlers(app, 10)

    @app.post("/docs")
    async def add(body: AddDocumentsRequest):
        return {"n": len(body.documents)}

    client = TestClient(app)
    ok = {"id": "a", "text": "t", "metadata": {"src": "atlas"}}
    assert client.post("/docs", json={"documents": [ok]}).json() == {"n": 1}
    bad = {"id": "b", "text": "t", "metadata": {f"k{i}": i for i in range(70)}}
    response = client.post("/docs", json={"documents": [ok, bad]})
    assert response.status_code == 422
    assert response.json()["error"]["message"] == (
        "invalid request: documents.1.metadata: Value error, metadata has 70 keys; at most 64 are allowed (METADATA_MAX_KEYS)"
    )
