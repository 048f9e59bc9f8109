"""SSE plumbing for the gateway: usage accounting and citations on top of vLLM's own chunks."""

from __future__ import annotations

import codecs
import json
import logging

import anyio
import msgspec
from fastapi import Request

from gateway.middleware.tenant_guard import record_usage
from rag.retrieval.answer_trim import SentenceHoldback, finish_answer
from vllm_bridge.compat import StreamOptions

logger = logging.getLogger("poolserve.streams")

# Every streamed token is parsed and written again here: msgspec does both in 2.5 us a chunk where the json
# module took 63 (one 2-core host, 2026-12-06), and writes compact UTF-8 JSON as vLLM itself does.
_decode_chunk = msgspec.json.Decoder().decode
_encode_chunk = msgspec.json.Encoder().encode


def _event(chunk: dict) -> str:
    return f"data: {_encode_chunk(chunk).decode()}\n\n"


async def sse_event_batches(body_iterator):
    """Complete SSE `data:` payloads, one list per piece that arrives.

    The chat replica sends a piece per stream-batching interval (several chunks when decoding
    outruns it); keeping that grouping through the gateway means one Ray Serve message per
    batch on the way to the proxy, not one per token.
    """
    buffer = ""
    # Incremental: a UTF-8 character split across two pieces is joined, never decoded half on its own.
    decoder = codecs.getincrementaldecoder("utf-8")()
    async for piece in body_iterator:
        buffer += decoder.decode(piece) if isinstance(piece, bytes) else piece
        events = []
        while "\n\n" in buffer:
            event, buffer = buffer.split("\n\n", 1)
            if event.startswith("data: "):
                events.append(event[len("data: ") :])
        if events:
            yield events
    if buffer.strip().startswith("data: "):
        yield [buffer.strip()[len("data: ") :]]


def force_stream_usage(body) -> tuple[bool, bool]:
    """Streams always ask the engine for usage on every chunk, so tenant accounting is right even
    when the client hangs up early. Returns what the client asked for: (final usage, usage on
    every chunk), so the stream can give it exactly that."""
    if not getattr(body, "stream", False):
        return True, False
    options = body.stream_options
    wanted = (bool(options and options.include_usage), bool(options and options.continuous_usage_stats))
    body.stream_options = StreamOptions(include_usage=True, continuous_usage_stats=True)
    return wanted


def stream_error_event(message: str, status: int = 503) -> str:
    """An OpenAI-style error event. It ends a broken stream in place of `[DONE]`, so no client
    mistakes a truncated answer for a finished one."""
    kind = "service_unavailable" if status == 503 else "internal_error"
    return f"data: {json.dumps({'error': {'message': message, 'type': kind, 'code': status}})}\n\n"


class StreamCompleteness:
    """Tracks whether an OpenAI stream really finished: every choice got a finish_reason, no error."""

    def __init__(self) -> None:
        self.open_choices: set[int] = set()
        self.finished_choices: set[int] = set()
        self.error: str | None = None

    def observe(self, chunk: dict) -> None:
        if "error" in chunk or chunk.get("object") == "error":
            error = chunk.get("error") or chunk
            self.error = str(error.get("message") if isinstance(error, dict) else error)
        for choice in chunk.get("choices") or []:
            index = choice.get("index", 0)
            self.open_choices.add(index)
            reason = choice.get("finish_reason")
            if reason in ("abort", "error"):  # vLLM aborted it (e.g. a draining replica): not an answer
                self.error = self.error or f"choice {index} ended with finish_reason {reason!r}"
            elif reason:
                self.finished_choices.add(index)

    def problem(self) -> str | None:
        if self.error:
            return f"the chat engine failed mid-answer: {self.error}"
        if not self.open_choices or self.open_choices - self.finished_choices:
            return "the chat engine stopped before the answer was finished (the replica died or is restarting)"
        return None


class UsageTally:
    """The tokens a stream has used so far, from vLLM's per-chunk usage (continuous_usage_stats). Each
    chunk's usage is its own choice's: that choice's completion tokens so far and its prompt's tokens
    (vllm chat_completion/serving.py, completion/serving.py). A stream of n choices, or of several
    prompts, used the sum over its choices, with each prompt counted once (choice i answers prompt
    i // n). The final usage-only chunk, when it comes, is the engine's own total."""

    def __init__(self, choices_per_prompt: int = 1) -> None:
        self.per_prompt = max(1, choices_per_prompt)
        self.completion: dict[int, int] = {}
        self.prompt: dict[int, int] = {}
        self.final: dict | None = None

    def observe(self, chunk: dict) -> None:
        usage = chunk.get("usage")
        if not isinstance(usage, dict):
            return
        choices = chunk.get("choices") or []
        if not choices:
            self.final = usage
            return
        for choice in choices:
            index = int(choice.get("index", 0))
            self.completion[index] = max(self.completion.get(index, 0), int(usage.get("completion_tokens") or 0))
            self.prompt[index // self.per_prompt] = int(usage.get("prompt_tokens") or 0)

    def usage(self) -> dict | None:
        if self.final is not None:
            return self.final
        if not self.completion:
            return None
        prompt, completion = sum(self.prompt.values()), sum(self.completion.values())
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class CappedAnswerTrimmer:
    """A RAG answer's stream, each choice ending at its last complete sentence when it hits the token cap
    (rag/retrieval/answer_trim.py): a choice's text after its last sentence end is held back, sent with its finish
    chunk when it stops on its own, dropped when it ends by length. finish_reason and usage are untouched."""

    def __init__(self) -> None:
        self.choices: dict[int, SentenceHoldback] = {}

    def apply(self, chunk: dict) -> None:
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            holdback = self.choices.setdefault(int(choice.get("index", 0)), SentenceHoldback())
            content = delta.get("content")
            out = holdback.feed(content) if isinstance(content, str) else ""
            if choice.get("finish_reason"):
                out += holdback.finish(choice["finish_reason"])
            if content is not None or out:
                delta["content"] = out


def trim_capped_choices(payload: dict) -> dict:
    """A non-streamed chat completion's choices that hit the token cap, cut to their last sentence end."""
    for choice in payload.get("choices") or []:
        message = choice.get("message")
        if isinstance(message, dict) and isinstance(message.get("content"), str):
            message["content"] = finish_answer(message["content"], choice.get("finish_reason"))
    return payload


async def tracked_stream(
    body_iterator,
    request: Request,
    model: str,
    cited: list[dict] | None,
    client_wants_usage: bool,
    client_continuous_usage: bool = False,
    on_broken=None,
    choices_per_prompt: int = 1,
    trim_at_cap: bool = False,
):
    """Pass OpenAI chunks through; record usage when the stream ends (or the client leaves: every
    choice's tokens so far, UsageTally); chat-with-RAG's first chunk carries `citations`. Usage the
    client did not ask for is removed. A stream the engine did not finish ends with an error event
    and no `[DONE]`. `trim_at_cap` (RAG answers): each choice ends at its last complete sentence when it
    hits the token cap (CappedAnswerTrimmer)."""
    first, done = True, False
    tally = UsageTally(choices_per_prompt)
    seen = StreamCompleteness()
    trimmer = CappedAnswerTrimmer() if trim_at_cap else None
    try:
        try:
            async for events in sse_event_batches(body_iterator):
                out = []
                for data in events:
                    if data == "[DONE]":
                        done, problem = True, seen.problem()
                        if problem and on_broken:
                            on_broken()
                        out.append(stream_error_event(problem) if problem else "data: [DONE]\n\n")
                        continue
                    chunk = _decode_chunk(data)
                    seen.observe(chunk)
                    tally.observe(chunk)
                    if trimmer is not None:
                        trimmer.apply(chunk)
                    if not chunk.get("choices"):
                        if not client_wants_usage or "error" in chunk or chunk.get("object") == "error":
                            continue  # the final usage-only chunk; an error is reported once, at the end
                    elif not client_continuous_usage:
                        chunk.pop("usage", None)
                    if first and cited is not None:
                        chunk["citations"] = cited
                    first = False
                    out.append(_event(chunk))
                if out:
                    yield "".join(out)
            if not done:  # the source ended without [DONE]
                if on_broken:
                    on_broken()
                yield stream_error_event(seen.problem() or "the chat stream ended without [DONE]")
        except Exception as exc:  # the replica died under the stream
            logger.warning("chat stream for %s broke", model, exc_info=True)
            if on_broken:
                on_broken()
            if not done:
                yield stream_error_event(f"the chat engine failed mid-answer: {type(exc).__name__}")
    finally:
        # A client that hangs up cancels this task; anyio's cancellation would abort the write.
        with anyio.CancelScope(shield=True):
            await record_usage(request, model, tally.usage())


async def rag_stream(body_iterator, cited: list[dict], retrieval: dict | None = None):
    """/v1/rag/query stream: a citations event (with `retrieval`'s keys: refused, best_similarity),
    answer deltas, a finish event (finish_reason: "stop", or "length" when the answer hit its token cap),
    a final usage event, [DONE].
    An error event from the chat stream is passed on and ends the stream without [DONE]."""
    yield f"data: {json.dumps({'object': 'rag.citations', 'citations': cited, **(retrieval or {})})}\n\n"
    failed = False
    async for events in sse_event_batches(body_iterator):
        out = []
        for data in events:
            if data == "[DONE]":
                continue  # drain the source so its usage is recorded before this response ends
            chunk = _decode_chunk(data)
            if chunk.get("object") == "error" or "error" in chunk:
                failed = True
                out.append(_event(chunk))
                continue
            for choice in chunk.get("choices", []):
                delta = (choice.get("delta") or {}).get("content")
                if delta:
                    out.append(_event({"object": "rag.delta", "delta": delta}))
                if choice.get("finish_reason"):
                    finish = {"object": "rag.finish", "finish_reason": choice["finish_reason"]}
                    out.append(_event(finish))
            if chunk.get("usage"):
                out.append(_event({"object": "rag.usage", "usage": chunk["usage"]}))
        if out:
            yield "".join(out)
    if not failed:
        yield "data: [DONE]\n\n"
