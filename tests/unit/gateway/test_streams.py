"""SSE plumbing: event splitting, usage accounting hooks, citations, the RAG event stream, and
streams that end early: only a stream whose every choice finished ends with [DONE]."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from gateway.middleware.tenant_guard import GUARD_KEY, TENANT_KEY
from gateway.streams import rag_stream, sse_event_batches, tracked_stream, trim_capped_choices
from tenancy.limits import RequestTokens, TokenReservation


def _chunks(*events: dict | str) -> list[str]:
    return [f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events]


async def _aiter(items):
    for item in items:
        yield item


async def _aiter_then_raise(items, exc: Exception):
    for item in items:
        yield item
    raise exc


def _collect(agen) -> list:
    async def run():
        return await asyncio.wait_for(_drain(agen), timeout=10)

    async def _drain(agen):
        return [item async for item in agen]

    return asyncio.run(run())


def _events(out: list[str]) -> list[str]:
    """The SSE events of a stream, however they were grouped into pieces."""
    return [event + "\n\n" for event in "".join(out).split("\n\n") if event]


def _payloads(out: list[str]) -> list:
    """Each event's payload: the parsed JSON, or the literal "[DONE]"."""
    events = [e.strip()[len("data: ") :] for e in _events(out)]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def _choice(index: int, content: str | None = None, finish: str | None = None) -> dict:
    delta = {"content": content} if content is not None else {}
    return {"index": index, "delta": delta, "finish_reason": finish}


DELTA = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": "Hi"}}]}
FINAL = {"object": "chat.completion.chunk", "choices": [_choice(0, finish="stop")]}
USAGE = {"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}}
REQUEST = SimpleNamespace(scope={})  # no tenant: usage recording is a no-op


def _is_error(payload, code: int = 503) -> bool:
    return bool(
        isinstance(payload, dict)
        and set(payload) == {"error"}
        and payload["error"]["code"] == code
        and payload["error"]["type"] == "service_unavailable"
        and payload["error"]["message"]
    )


def _tracked(pieces, wants_usage: bool = False, request=REQUEST) -> list:
    source = pieces if hasattr(pieces, "__aiter__") else _aiter(pieces)
    return _payloads(_collect(tracked_stream(source, request, "m", None, wants_usage)))


# ---- well-formed streams ------------------------------------------------------------------


def test_sse_events_reassembles_events_split_across_pieces():
    raw = "".join(_chunks(DELTA, "[DONE]"))
    pieces = [raw[:7], raw[7:30].encode(), raw[30:]]
    assert _collect(sse_event_batches(_aiter(pieces))) == [[json.dumps(DELTA), "[DONE]"]]


def test_a_batch_of_chunks_leaves_the_gateway_as_one_piece():
    batched = ["".join(_chunks(DELTA, DELTA)), "".join(_chunks(DELTA, FINAL, USAGE, "[DONE]"))]
    out = _collect(tracked_stream(_aiter(batched), REQUEST, "m", None, True))
    assert len(out) == 2
    assert [e.strip() for e in _events(out)][-1] == "data: [DONE]" and len(_events(out)) == 6


def test_tracked_stream_drops_forced_usage_chunk_when_client_did_not_ask():
    assert _tracked(_chunks(DELTA, FINAL, USAGE, "[DONE]")) == [DELTA, FINAL, "[DONE]"]


def test_tracked_stream_keeps_usage_when_asked_and_puts_citations_first():
    cited = [{"document_id": "d", "chunk_id": "d#0", "score": 0.9, "text": "t"}]
    out = _payloads(_collect(tracked_stream(_aiter(_chunks(DELTA, FINAL, USAGE, "[DONE]")), REQUEST, "m", cited, True)))
    assert out[0]["citations"] == cited and out[0]["choices"] == DELTA["choices"]
    assert out[1] == FINAL and out[2]["usage"] == USAGE["usage"]
    assert all("citations" not in chunk for chunk in out[1:3]) and out[3] == "[DONE]"


def test_n2_stream_with_every_choice_finished_ends_with_done():
    both = {"choices": [_choice(0, "a"), _choice(1, "b")]}
    out = _tracked(
        _chunks(both, {"choices": [_choice(1, finish="length")]}, {"choices": [_choice(0, finish="stop")]}, "[DONE]")
    )
    assert out[-1] == "[DONE]" and not any(_is_error(p) for p in out)


def test_rag_stream_sequence():
    cited = [{"document_id": "d"}]
    out = _payloads(_collect(rag_stream(_aiter(_chunks(DELTA, FINAL, USAGE, "[DONE]")), cited)))
    assert out == [
        {"object": "rag.citations", "citations": cited},
        {"object": "rag.delta", "delta": "Hi"},
        {"object": "rag.finish", "finish_reason": "stop"},
        {"object": "rag.usage", "usage": USAGE["usage"]},
        "[DONE]",
    ]


def _answer_chunks(pieces: list[str], finish: str) -> list[dict]:
    return [{"object": "chat.completion.chunk", "choices": [_choice(0, piece)]} for piece in pieces] + [
        {"object": "chat.completion.chunk", "choices": [_choice(0, "", finish)]}
    ]


def _text(out: list) -> str:
    return "".join(
        (c["choices"][0]["delta"].get("content") or "") for c in out if isinstance(c, dict) and c.get("choices")
    )


@pytest.mark.parametrize(
    "finish, expected",
    [("length", "It checks the ref [1]. Then it pushes."), ("stop", "It checks the ref [1]. Then it pushes. And the")],
)
def test_a_rag_stream_at_the_cap_ends_at_its_last_sentence(finish, expected):
    pieces = ["It checks", " the ref [1", "].", " Then it pushes", ".", " And the"]
    out = _payloads(
        _collect(
            tracked_stream(
                _aiter(_chunks(*_answer_chunks(pieces, finish), USAGE, "[DONE]")),
                REQUEST,
                "m",
                [],
                True,
                trim_at_cap=True,
            )
        )
    )
    assert _text(out) == expected and out[-1] == "[DONE]"
    assert out[0]["choices"][0]["delta"]["content"] == "It checks"  # the first sentence is not held
    assert [c["choices"][0]["finish_reason"] for c in out if isinstance(c, dict) and c.get("choices")][-1] == finish
    assert out[-2]["usage"] == USAGE["usage"]  # usage as generated


def test_without_trim_a_capped_stream_is_passed_as_generated():
    pieces = ["Done. And the"]
    out = _payloads(
        _collect(
            tracked_stream(_aiter(_chunks(*_answer_chunks(pieces, "length"), "[DONE]")), REQUEST, "m", None, False)
        )
    )
    assert _text(out) == "Done. And the"


def test_n2_rag_stream_trims_each_choice_on_its_own():
    chunks = [
        {"choices": [_choice(0, "A one. A tw"), _choice(1, "B one. B tw")]},
        {"choices": [_choice(1, "o.", "stop")]},
        {"choices": [_choice(0, "o", "length")]},
        "[DONE]",
    ]
    out = _payloads(_collect(tracked_stream(_aiter(_chunks(*chunks)), REQUEST, "m", [], False, trim_at_cap=True)))
    texts = {0: "", 1: ""}
    for chunk in out[:-1]:
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["delta"].get("content") or ""
    assert texts == {0: "A one.", 1: "B one. B two."}


def test_rag_query_stream_says_how_the_answer_finished():
    source = tracked_stream(
        _aiter(_chunks(*_answer_chunks(["Yes. Bu"], "length"), USAGE, "[DONE]")),
        REQUEST,
        "m",
        None,
        True,
        False,
        trim_at_cap=True,
    )
    out = _payloads(_collect(rag_stream(source, [])))
    assert [e for e in out if isinstance(e, dict) and e["object"] in ("rag.delta", "rag.finish")] == [
        {"object": "rag.delta", "delta": "Yes."},
        {"object": "rag.finish", "finish_reason": "length"},
    ]
    assert out[-1] == "[DONE]"


def test_trim_capped_choices_cuts_only_the_capped_ones():
    payload = {
        "choices": [
            {"index": 0, "message": {"content": "One. Tw"}, "finish_reason": "length"},
            {"index": 1, "message": {"content": "One. Tw"}, "finish_reason": "stop"},
            {"index": 2, "message": {"content": None}, "finish_reason": "length"},
        ]
    }
    assert [c["message"]["content"] for c in trim_capped_choices(payload)["choices"]] == ["One.", "One. Tw", None]


# ---- broken streams: an error event instead of [DONE] -------------------------------------


def test_truncated_stream_without_finish_reason_ends_with_error_not_done():
    out = _tracked(_chunks(DELTA, USAGE, "[DONE]"))
    assert out[:-1] == [DELTA] and _is_error(out[-1]) and "[DONE]" not in out


def test_stream_with_no_choices_at_all_is_not_finished():
    out = _tracked(_chunks(USAGE, "[DONE]"))
    assert _is_error(out[-1]) and "[DONE]" not in out


def test_n2_stream_where_only_choice_0_finished_is_an_error():
    both = {"choices": [_choice(0, "a"), _choice(1, "b")]}
    out = _tracked(_chunks(both, {"choices": [_choice(0, finish="stop")]}, "[DONE]"))
    assert _is_error(out[-1]) and "[DONE]" not in out
    assert sum(_is_error(p) for p in out) == 1


def test_source_raising_mid_stream_ends_with_error_event():
    source = _aiter_then_raise(_chunks(DELTA), RuntimeError("ActorDiedError: replica gone"))
    out = _tracked(source)
    assert out[0] == DELTA and len(out) == 2 and _is_error(out[1])
    assert "RuntimeError" in out[1]["error"]["message"]


def test_source_ending_without_done_ends_with_error():
    out = _tracked(_chunks(DELTA, FINAL))  # every choice finished, but no [DONE]
    assert out[:2] == [DELTA, FINAL] and _is_error(out[-1]) and "[DONE]" not in out
    out = _tracked(_chunks(DELTA))
    assert _is_error(out[-1]) and "[DONE]" not in out


def test_error_chunk_from_the_engine_ends_with_one_error_and_no_done():
    engine_error = {"error": {"message": "EngineDeadError: boom", "type": "InternalServerError", "code": 500}}
    for wants_usage in (False, True):
        out = _tracked(_chunks(DELTA, engine_error, FINAL, "[DONE]"), wants_usage=wants_usage)
        assert "[DONE]" not in out and _is_error(out[-1])
        assert "EngineDeadError: boom" in out[-1]["error"]["message"]
        assert engine_error not in out  # reported once, as the final event
    legacy = {"object": "error", "message": "engine is dead", "type": "InternalServerError", "code": 500}
    out = _tracked(_chunks(DELTA, legacy, "[DONE]"))
    assert "[DONE]" not in out and _is_error(out[-1]) and "engine is dead" in out[-1]["error"]["message"]


def test_rag_stream_over_a_broken_tracked_stream_ends_with_the_error():
    source = _aiter_then_raise(_chunks(DELTA), RuntimeError("replica died"))
    tracked = tracked_stream(source, REQUEST, "m", None, True, False)
    out = _payloads(_collect(rag_stream(tracked, [{"document_id": "d"}])))
    assert out[0]["object"] == "rag.citations" and out[1] == {"object": "rag.delta", "delta": "Hi"}
    assert _is_error(out[-1]) and "[DONE]" not in out

    truncated = tracked_stream(_aiter(_chunks(DELTA, USAGE, "[DONE]")), REQUEST, "m", None, True, False)
    out = _payloads(_collect(rag_stream(truncated, [])))
    assert _is_error(out[-1]) and "[DONE]" not in out
    assert {"object": "rag.usage", "usage": USAGE["usage"]} in out  # usage still reported


# ---- usage is recorded however the stream ends -------------------------------------------


class _FakeGuard:
    def __init__(self) -> None:
        self.recorded: list[tuple] = []
        self.store = SimpleNamespace(record_usage=lambda *args: self.recorded.append(("usage", *args)))
        self.limiter = SimpleNamespace(
            settle=lambda *args: self.recorded.append(("settle", *args)),
            charge_tokens=lambda *args: self.recorded.append(("charge", *args)),
        )
        self.metrics = SimpleNamespace(observe_request=lambda *a: None, observe_tokens=lambda *a: None)


def test_usage_is_recorded_when_the_source_raises():
    guard, tenant = _FakeGuard(), SimpleNamespace(name="acme")
    tokens = RequestTokens(TokenReservation(minute=1, tokens=4))
    request = SimpleNamespace(scope={TENANT_KEY: tenant, GUARD_KEY: guard, "poolserve.tokens": tokens})
    source = _aiter_then_raise(_chunks(DELTA, USAGE), RuntimeError("gone"))
    out = _tracked(source, request=request)
    assert _is_error(out[-1])
    assert ("usage", "acme", "m", 5, 1) in guard.recorded
    # 6 used against 4 reserved: the 2 beyond are charged at once; the request's close settles the rest.
    assert ("charge", tenant, 2) in guard.recorded and tokens.used == 6 and tokens.charged == 6


def test_a_utf8_character_split_across_pieces_is_joined():
    import asyncio

    from gateway.streams import sse_event_batches

    payload = 'data: {"text": "naïve €"}\n\n'.encode()
    cut = payload.index("€".encode()) + 1  # inside the three bytes of the euro sign

    async def pieces():
        yield payload[:cut]
        yield payload[cut:]

    async def collect():
        return [events async for events in sse_event_batches(pieces())]

    assert asyncio.run(collect()) == [['{"text": "naïve €"}']]


def _usage_chunk(index: int, prompt: int, completion: int) -> dict:
    return {
        "object": "chat.completion.chunk",
        "choices": [_choice(index, "x")],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion},
    }


def test_a_stream_of_n_choices_cut_before_its_final_usage_is_charged_every_choice():
    from gateway.streams import UsageTally

    tally = UsageTally(choices_per_prompt=3)
    for chunk in (
        _usage_chunk(0, 10, 0),
        _usage_chunk(1, 10, 0),
        _usage_chunk(2, 10, 0),
        _usage_chunk(0, 10, 4),
        _usage_chunk(1, 10, 7),
        _usage_chunk(2, 10, 2),
        _usage_chunk(0, 10, 5),
    ):
        tally.observe(chunk)
    assert tally.usage() == {"prompt_tokens": 10, "completion_tokens": 5 + 7 + 2, "total_tokens": 24}
    tally.observe(USAGE)  # the engine's own total, once it comes, is the answer
    assert tally.usage() == USAGE["usage"]


def test_a_list_of_prompts_counts_each_prompt_once_and_every_choice():
    from gateway.streams import UsageTally

    tally = UsageTally(choices_per_prompt=2)  # 2 prompts x n=2: choices 0,1 answer prompt 0; 2,3 prompt 1
    for chunk in (_usage_chunk(0, 8, 3), _usage_chunk(1, 8, 1), _usage_chunk(2, 20, 6), _usage_chunk(3, 20, 2)):
        tally.observe(chunk)
    assert tally.usage() == {"prompt_tokens": 28, "completion_tokens": 12, "total_tokens": 40}
    assert UsageTally().usage() is None  # nothing seen: nothing to charge


def test_a_hung_up_n2_stream_records_both_choices():
    guard, tenant = _FakeGuard(), SimpleNamespace(name="acme")
    tokens = RequestTokens(TokenReservation(minute=1, tokens=100))
    request = SimpleNamespace(scope={TENANT_KEY: tenant, GUARD_KEY: guard, "poolserve.tokens": tokens})
    source = _aiter_then_raise(_chunks(_usage_chunk(0, 10, 6), _usage_chunk(1, 10, 9)), RuntimeError("client gone"))
    _payloads(_collect(tracked_stream(source, request, "m", None, False, choices_per_prompt=2)))
    assert ("usage", "acme", "m", 10, 15) in guard.recorded
