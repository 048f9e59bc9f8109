"""A ray.serve.llm engine without vLLM, and the Serve handle that lets ray.serve.llm's own ingress call it
without Ray: the way Ray's tests do it (MockVLLMEngine, python/ray/llm/tests/serve/mocks/mock_vllm_engine.py),
but deterministic, and with what poolserve's gateway reads of a vLLM answer (usage on stream chunks when
`stream_options` asks for it, `finish_reason: length` at the token cap, n choices).

FakeLLMEngine implements LLMEngine (ray.llm._internal.serve.core.engine.protocol), the protocol LLMServer drives:
chat/completions are async generators that yield SSE strings ("data: {json}\\n\\n", then "data: [DONE]\\n\\n")
for a stream, or one ChatCompletionResponse/CompletionResponse otherwise. Its lifecycle calls (start, sleep,
wakeup, shutdown) are recorded in `log`, shared with its `_engine_client` (VLLMEngine's attribute for vLLM's
AsyncLLM, which vllm_bridge.compat.engine_client reads).

engine_ingress(engine) is ray.serve.llm's real OpenAiIngress over a FakeLLMServerHandle: its chat() and
completions() answer a JSONResponse or a StreamingResponse exactly as in a running stack.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncGenerator
from types import SimpleNamespace
from typing import Any

from ray.llm._internal.serve.core.configs.openai_api_models import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    EmbeddingRequest,
    EmbeddingResponse,
    ErrorResponse,
)
from ray.llm._internal.serve.core.engine.protocol import LLMEngine

from tests.fakes.handles import RemoteMethod
from vllm_bridge.compat import ModelCard, OpenAiIngress

CREATED = 1_700_000_000  # every answer's `created`: fixed, so answers compare equal run to run
DEFAULT_TOKENS = 8  # tokens generated when the request sets no max_tokens (Ray's mock draws a random count)

_NEW_CLIENT: Any = object()  # FakeLLMEngine(client=...) not given: a FakeAsyncLLM on the engine's log


class FakeAsyncLLM:
    """vLLM's AsyncLLM as the chat replica touches it when it stops an engine: shutdown(timeout)."""

    def __init__(self, log: list) -> None:
        self.log = log

    def shutdown(self, timeout: float | None = None) -> None:
        self.log.append(("client.shutdown", timeout))


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content or "")


def _content(message: Any) -> str:
    return _text_of(message.get("content") if isinstance(message, dict) else getattr(message, "content", ""))


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"


class FakeLLMEngine(LLMEngine):
    """Deterministic answers: the reply's words (`reply`, else test_0 test_1 ...), one token a word, cut at the
    request's max_tokens (finish_reason "length") and otherwise DEFAULT_TOKENS words long when there is no
    `reply`; the prompt is counted a word a token too."""

    def __init__(
        self,
        llm_config: Any = None,
        *,
        log: list | None = None,
        client: Any = _NEW_CLIENT,
        reply: str | None = None,
        started: bool = False,
    ) -> None:
        self.llm_config = llm_config
        self.log = [] if log is None else log
        self._engine_client = FakeAsyncLLM(self.log) if client is _NEW_CLIENT else client
        self.reply, self.started = reply, started
        self.requests: list[Any] = []  # every chat/completions/embeddings request, in order
        self.loras: dict[str, Any] = {}
        self._sleeping = False
        self._ids = 0

    # ---- lifecycle (LLMServer's start, sleep and wakeup; the chat replica's stop) ----------------------------

    async def start(self) -> None:
        self.log.append(("start",))
        self.started = True

    async def sleep(self, **kwargs: Any) -> None:
        self.log.append(("sleep", kwargs))
        self._sleeping = True

    async def wakeup(self, **kwargs: Any) -> None:
        self.log.append(("wakeup", kwargs))
        self._sleeping = False

    async def is_sleeping(self) -> bool:
        return self._sleeping

    async def shutdown(self) -> None:
        self.log.append(("engine.shutdown",))

    async def check_health(self) -> None:
        if not self.started:
            raise RuntimeError("Engine not started")

    def routing_stats(self) -> dict:
        return {}

    async def resolve_lora(self, lora_model: Any) -> None:
        self.loras[lora_model.model_id] = lora_model

    async def reset_prefix_cache(self) -> None:
        pass

    # ---- generation ------------------------------------------------------------------------------------------

    def _words(self, request: Any) -> tuple[list[str], str]:
        cap = getattr(request, "max_completion_tokens", None) or getattr(request, "max_tokens", None)
        if self.reply is None:
            return [f"test_{i}" for i in range(cap or DEFAULT_TOKENS)], "length" if cap else "stop"
        words = self.reply.split()
        return (words[:cap], "length") if cap is not None and len(words) > cap else (words, "stop")

    def _start(self, request: Any, prefix: str) -> tuple[str, str]:
        if not self.started:
            raise RuntimeError("Engine not started")
        self.requests.append(request)
        self._ids += 1
        return getattr(request, "request_id", None) or f"{prefix}-fake-{self._ids}", request.model or getattr(
            self.llm_config, "model_id", "fake-model"
        )

    async def chat(
        self, request: ChatCompletionRequest, raw_request_info: Any = None
    ) -> AsyncGenerator[str | ChatCompletionResponse | ErrorResponse, None]:
        request_id, model = self._start(request, "chatcmpl")
        prompt = sum(len(_content(m).split()) for m in request.messages or [])
        words, finish = self._words(request)
        choices = request.n or 1
        if request.stream:
            head = {"id": request_id, "object": "chat.completion.chunk", "created": CREATED, "model": model}
            async for chunk in self._stream(head, request, prompt, words, finish, choices, chat=True):
                yield chunk
            return
        yield ChatCompletionResponse(
            id=request_id,
            object="chat.completion",
            created=CREATED,
            model=model,
            choices=[
                {"index": i, "message": {"role": "assistant", "content": " ".join(words)}, "finish_reason": finish}
                for i in range(choices)
            ],
            usage=_usage(prompt, len(words) * choices),
        )

    async def completions(
        self, request: CompletionRequest, raw_request_info: Any = None
    ) -> AsyncGenerator[str | CompletionResponse | ErrorResponse, None]:
        request_id, model = self._start(request, "cmpl")
        prompts = request.prompt if isinstance(request.prompt, list) else [request.prompt]
        prompt = sum(len(_text_of(p).split()) for p in prompts)
        words, finish = self._words(request)
        choices = (request.n or 1) * len(prompts)
        if request.stream:
            head = {"id": request_id, "object": "text_completion", "created": CREATED, "model": model}
            async for chunk in self._stream(head, request, prompt, words, finish, choices, chat=False):
                yield chunk
            return
        yield CompletionResponse(
            id=request_id,
            object="text_completion",
            created=CREATED,
            model=model,
            choices=[{"index": i, "text": " ".join(words), "finish_reason": finish} for i in range(choices)],
            usage=_usage(prompt, len(words) * choices),
        )

    async def _stream(
        self, head: dict, request: Any, prompt: int, words: list[str], finish: str, choices: int, *, chat: bool
    ) -> AsyncGenerator[str, None]:
        """vLLM's stream: per choice a role chunk (chat), a chunk a token, the last with its finish_reason; usage
        on every chunk with stream_options.continuous_usage_stats, and a last chunk of usage alone (no choices)
        with include_usage."""
        options = getattr(request, "stream_options", None)
        continuous = bool(options and options.include_usage and options.continuous_usage_stats)
        generated = 0
        for index in range(choices):
            if chat:
                yield _sse(
                    {
                        **head,
                        "choices": [
                            {"index": index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
                        ],
                    }
                )
            for position, word in enumerate(words):
                generated += 1
                text = word if position == len(words) - 1 else word + " "
                last = position == len(words) - 1
                choice = {"index": index, "finish_reason": finish if last else None}
                choice.update({"delta": {"content": text}} if chat else {"text": text})
                chunk = {**head, "choices": [choice]}
                if continuous:
                    chunk["usage"] = _usage(prompt, generated)
                yield _sse(chunk)
        if options and options.include_usage:
            yield _sse({**head, "choices": [], "usage": _usage(prompt, generated)})
        yield "data: [DONE]\n\n"

    async def embeddings(
        self, request: EmbeddingRequest, raw_request_info: Any = None
    ) -> AsyncGenerator[EmbeddingResponse | ErrorResponse, None]:
        request_id, model = self._start(request, "embd")
        texts = request.input if isinstance(request.input, list) else [request.input]
        tokens = sum(len(str(t).split()) for t in texts)
        yield EmbeddingResponse(
            id=request_id,
            object="list",
            created=CREATED,
            model=model,
            data=[
                {"object": "embedding", "index": i, "embedding": [float(len(str(t)))] * 4} for i, t in enumerate(texts)
            ],
            usage={"prompt_tokens": tokens, "total_tokens": tokens},
        )

    async def transcriptions(self, request: Any, raw_request_info: Any = None) -> AsyncGenerator[ErrorResponse, None]:
        yield ErrorResponse(
            error={"message": "the fake engine transcribes nothing", "type": "BadRequestError", "code": 400}
        )


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class FakeLLMServerHandle:
    """The LLMServer deployment's handle as OpenAiIngress calls it: options(...) is the same handle; an async
    generator method's .remote(...) is its stream (a streaming DeploymentResponseGenerator), any other
    method's an awaitable (RemoteMethod)."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine

    def options(self, **_options: Any) -> FakeLLMServerHandle:
        return self

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.engine, name)
        if inspect.isasyncgenfunction(method):
            return SimpleNamespace(remote=method)
        return RemoteMethod(method)


def ingress_args(engine: LLMEngine, model_id: str = "chat-model") -> tuple[dict, dict]:
    """OpenAiIngress's (llm_deployments, model_cards) for one model served by `engine`."""
    card = ModelCard(id=model_id, object="model", owned_by="fake", permission=[], metadata={})
    return {model_id: FakeLLMServerHandle(engine)}, {model_id: card}


def engine_ingress(engine: LLMEngine, model_id: str = "chat-model") -> OpenAiIngress:
    """ray.serve.llm's OpenAiIngress over `engine`, as Serve would build it for one model, without Ray."""
    return OpenAiIngress(*ingress_args(engine, model_id))
