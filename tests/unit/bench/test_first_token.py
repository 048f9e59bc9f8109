"""bench/harness/first_token.py: the first content chunk of a stream, medians, and the split against raw vLLM."""

from __future__ import annotations

import json

import pytest

from bench.harness.first_token import _first_content, probe_prompts, split_against_raw, summarise


def _chunk(content: str | None, role: str | None = None) -> str:
    delta = {k: v for k, v in (("role", role), ("content", content)) if v is not None}
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]})


def test_the_first_token_is_the_first_chunk_with_generated_text():
    lines = iter(["", _chunk(None, role="assistant"), _chunk(""), _chunk("Hel"), _chunk("lo"), "data: [DONE]"])
    assert _first_content(lines)
    assert next(lines) == _chunk("lo")  # it stopped reading at the first token
    assert not _first_content(iter([_chunk(None, role="assistant"), ": keep-alive", "data: [DONE]"]))


def test_probe_prompts_share_no_prefix_and_are_the_same_for_both_servers():
    prompts = probe_prompts(5)
    assert len({p.split(" ", 1)[0] for p in prompts}) == 5 and prompts == probe_prompts(5)


def test_the_stack_s_extra_time_to_first_token_is_split_into_its_parts():
    def sample(ttft, **parts):
        return {"ttft_ms": ttft, "server_timing_ms": parts}

    stack = summarise(
        [
            sample(500.0, admit=50.0, prepare=50.0, wake=0.0, engine=300.0),  # the warm-up: left out
            sample(90.0, admit=1.0, prepare=3.0, wake=0.0, engine=80.0),
            sample(100.0, admit=2.0, prepare=4.0, wake=0.0, engine=88.0),
            sample(110.0, admit=3.0, prepare=5.0, wake=0.0, engine=96.0),
        ]
    )
    assert stack["n"] == 3 and stack["ttft_ms_p50"] == 100.0 and stack["ttft_ms_min"] == 90.0
    assert stack["server_timing_ms_p50"] == {"admit": 2.0, "prepare": 4.0, "wake": 0.0, "engine": 88.0}
    assert stack["beyond_server_timing_ms_p50"] == 6.0
    raw = summarise([sample(300.0), sample(70.0), sample(75.0), sample(80.0)])
    assert raw["server_timing_ms_p50"] == {} and raw["beyond_server_timing_ms_p50"] is None
    split = split_against_raw(stack, raw)
    assert split == pytest.approx(
        {"extra_ms": 25.0, "gateway_ms": 6.0, "engine_beyond_raw_ms": 13.0, "http_and_proxy_ms": 6.0}
    )


def test_a_probe_times_each_stream_to_its_first_token_and_reads_the_gateway_s_header():
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from bench.harness.first_token import first_token_times

    seen = []

    class Streams(BaseHTTPRequestHandler):
        def do_POST(self):
            seen.append(
                (
                    self.path,
                    self.headers["Authorization"],
                    json.loads(self.rfile.read(int(self.headers["Content-Length"]))),
                )
            )
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Server-Timing", "admit;dur=1.5, prepare;dur=2.0, wake;dur=0.00, engine;dur=40.25")
            self.end_headers()
            for line in (_chunk(None, role="assistant"), _chunk("Hi"), _chunk(" there"), "data: [DONE]"):
                self.wfile.write(f"{line}\n\n".encode())

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Streams)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        samples = first_token_times(f"http://127.0.0.1:{server.server_port}", "k", "m", ["one", "two"], timeout_s=10)
    finally:
        server.shutdown()
        server.server_close()
    assert [s["server_timing_ms"] for s in samples] == [
        {"admit": 1.5, "prepare": 2.0, "wake": 0.0, "engine": 40.25}
    ] * 2
    assert all(0 < s["ttft_ms"] < 10_000 for s in samples)
    assert [(path, auth, body["messages"][0]["content"], body["stream"]) for path, auth, body in seen] == [
        ("/v1/chat/completions", "Bearer k", "one", True),
        ("/v1/chat/completions", "Bearer k", "two", True),
    ]
