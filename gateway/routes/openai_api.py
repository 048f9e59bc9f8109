"""The OpenAI routes as poolserve serves them: ray.serve.llm's ingress (the class this mixin is combined
with in deployments/gateway.py) parses and streams; these methods add what poolserve owns around it: the
tenant's model rights, prompt-length and choice bounds, TPM reservations and usage, per-tenant
prefix-cache salts, embeddings through the sentence-transformers replica, and /healthz.

The replica handles (`self._embedder`, `self._retriever`, the engines' `_default_serve_handles`) are
whatever the Ray binding hands in; nothing here imports Ray Serve.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import time

import numpy as np
from fastapi import HTTPException, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response, StreamingResponse

from gateway.http_errors import EngineNotRunning, error_body, unavailable
from gateway.on_demand_gate import OnDemandGate
from gateway.middleware.request_timing import mark, timing_headers
from gateway.middleware.tenant_guard import guard_of, record_usage, reserve_tokens, tenant_of, tpm_of
from gateway.schemas import RagOptions, ServedModelCard, ServedModelList
from gateway.streams import force_stream_usage, trim_capped_choices, tracked_stream
from gateway.work import release_heap_after_sending, run_to_completion, without_credentials
from tenancy.limits import estimate_text_tokens
from vllm_bridge.compat import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, ModelCard

logger = logging.getLogger("poolserve.gateway")
# vLLM's default max_tokens for /v1/completions (OpenAI's too), used in the TPM estimate: vLLM's
# number, not a poolserve setting.
VLLM_COMPLETION_MAX_TOKENS = 16


class OpenAIRoutes:
    """Mixed in before ray.serve.llm's OpenAiIngress; needs the attributes deployments/gateway.py's
    constructor sets (_embedder, _retriever, _settings, _chat_model_id, _embed_model_id, _engines,
    _healthy_until; _on_demand when engines are on demand)."""

    _on_demand = OnDemandGate(None, set())  # no engine on demand unless the Ray binding hands a coordinator in

    # ---- health and models -------------------------------------------------------------
    async def healthz(self, request: Request) -> Response:
        if time.monotonic() > self._healthy_until:
            calls = {
                "embedder": self._embedder.ready.remote(),
                "retriever": self._retriever.ready.remote(),
                **{
                    engine.replica: self._default_serve_handles[model].check_health.remote()
                    for model, engine in self._engines.items()
                },
            }
            checks = [asyncio.ensure_future(self._ready_check(call)) for call in calls.values()]
            done, pending = await asyncio.wait(checks, timeout=self._settings.health_timeout_s)
            for task in pending:
                task.cancel()
            replicas = {
                name: (
                    "ok"
                    if task in done and task.result() is None
                    else f"down: {task.result() if task in done else 'no answer in %gs' % self._settings.health_timeout_s}"
                )
                for name, task in zip(calls, checks)
            }
            replicas["gateway"] = "ok"
            down = sorted(name for name, state in replicas.items() if state != "ok")
            if down:
                response = error_body(503, f"not ready: {', '.join(down)} down or starting", "service_unavailable")
                body = json.loads(response.body)
                body["replicas"] = replicas
                body["pool"] = _public_pool_state(request)
                return JSONResponse(
                    body, status_code=503, headers={"Retry-After": str(self._settings.unavailable_retry_after_s)}
                )
            self._healthy_until = time.monotonic() + self._settings.healthy_ttl_s
        names = [engine.replica for engine in self._engines.values()] + ["embedder", "retriever", "gateway"]
        return JSONResponse({"status": "ok", "replicas": {n: "ok" for n in names}, "pool": _public_pool_state(request)})

    async def _engine(self, call, model: str):
        """A call to the chat replica; when it fails, /healthz re-checks (the error is mapped to 503).
        Ray Serve queues a call while its deployment has no running replica (its node is lost, it is being
        replaced) and would hold it until one is back: a call that has not answered within
        gateway.health_timeout_s asks the controller whether the engine has a running replica, and is
        answered 503 + Retry-After at once when it has none. A slow but running engine is left alone."""
        task = asyncio.ensure_future(call)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=self._settings.health_timeout_s)
                if done:
                    return task.result()
                if await self._engine_running(model) is False:
                    task.cancel()
                    raise EngineNotRunning(
                        f"chat engine {model!r} has no running replica (its node is lost or it is being replaced)"
                    )
        except Exception:
            self._recheck_health()
            raise
        finally:
            if not task.done():  # the client left: the call does not run on unseen
                task.cancel()

    async def _engine_running(self, model: str) -> bool | None:
        """Whether the engine's deployment has a running replica; None when unknown. The Ray binding
        (deployments/gateway.py) answers it from the Serve controller."""
        return None

    def _recheck_health(self) -> None:
        """A replica just failed a request: /healthz asks every replica again instead of its cache."""
        self._healthy_until = 0.0

    @staticmethod
    async def _ready_check(call) -> str | None:
        """None when the replica answered, else why not (a replica still starting raises)."""
        try:
            await call
            return None
        except Exception as exc:
            return type(exc).__name__

    def _embed_card(self) -> ModelCard:
        return ModelCard(
            id=self._embed_model_id,
            object="model",
            owned_by="poolserve",
            permission=[],
            metadata={"model_id": self._embed_model_id, "task": "embedding"},
        )

    async def models(self, request: Request) -> ServedModelList:
        """The served models; with on-demand engines, each card has a `status`: awake, asleep, waking or
        sleeping (always-on engines and the embedder: awake)."""
        listing = await super().models()
        cards = [*listing.data, self._embed_card()]
        states = await self._on_demand.states()
        cards = [
            ServedModelCard(**card.model_dump(), status=states.get(card.id, "awake") if states else None)
            for card in cards
        ]
        return ServedModelList(data=[card for card in cards if self._may_use(request, card.id)])

    async def model_data(self, model: str, request: Request) -> ModelCard:
        await self._require_model(request, model)
        if model == self._embed_model_id:
            return self._embed_card()
        return await super().model_data(model)

    # ---- tenants ----------------------------------------------------------------------------
    @staticmethod
    def _may_use(request: Request, model: str) -> bool:
        tenant = tenant_of(request)
        return tenant is None or tenant.may_use_model(model)

    async def _require_model(self, request: Request, model: str | None) -> str:
        """The served model a request names (or the chat default): 404 unknown, 403 not allowed."""
        model = model or self._chat_model_id
        # Exact names only: ray.serve.llm would read "model:suffix" as a LoRA adapter (none is served).
        if model != self._embed_model_id and model not in self._model_cards:
            raise HTTPException(404, f"model {model!r} does not exist; GET /v1/models lists the served models")
        if not self._may_use(request, model):
            raise HTTPException(403, f"this API key's tenant may not use model {model!r}")
        return model

    def _tenant(self, request: Request) -> str:
        return tenant_of(request).name

    async def _generate(
        self, request: Request, model: str, call, body, cited: list[dict] | None, usage_wanted: tuple[bool, bool]
    ) -> Response:
        """The engine's answer to a checked and reserved request, with its usage recorded. A streamed
        answer is charged what it used when it ends or the client leaves (tracked_stream). A non-streamed
        one runs to the end even if the client hangs up, as an embedding or an ingest does: nothing is
        sent before it is whole, and without its final usage the tenant would be charged nothing."""

        async def engine_answer() -> Response:
            mark(request, "engine_called")
            response = await self._engine(call, model)
            mark(request, "engine_answered")  # a stream's first chunk: ray.serve.llm peeks at it before answering
            return await self._finish(request, model, response, cited, usage_wanted, getattr(body, "n", None) or 1)

        async def answer() -> Response:  # an on-demand engine woken for it, and counted in flight until it ends
            return await self._on_demand.run(model, request, engine_answer)

        mark(request, "prepared")
        return await answer() if getattr(body, "stream", False) else await run_to_completion(answer())

    async def _finish(
        self,
        request: Request,
        model: str,
        response: Response,
        cited: list[dict] | None,
        usage_wanted: tuple[bool, bool],
        choices_per_prompt: int = 1,
    ) -> Response:
        """Record usage (streams: when they end) and attach citations for chat-with-RAG, whose choices that
        hit the token cap end at their last complete sentence (rag.trim_capped_answers)."""
        trim = cited is not None and self._settings.trim_capped_answers
        if isinstance(response, StreamingResponse):
            stream = tracked_stream(
                response.body_iterator,
                request,
                model,
                cited,
                *usage_wanted,
                on_broken=self._recheck_health,
                choices_per_prompt=choices_per_prompt,
                trim_at_cap=trim,
            )
            return StreamingResponse(stream, media_type="text/event-stream", headers=timing_headers(request))
        if response.status_code >= 500:  # the engine failed or is restarting: the client may retry
            logger.warning("chat replica answered %s: %s", response.status_code, bytes(response.body)[:300])
            self._healthy_until = 0.0  # /healthz checks again instead of trusting its last answer
            return unavailable(
                "chat", bytes(response.body).decode(errors="replace")[:300], self._settings.unavailable_retry_after_s
            )
        payload = json.loads(response.body)
        await record_usage(request, model, payload.get("usage"), response.status_code)
        if cited is None:
            response.headers.update(timing_headers(request))
            return response
        payload["citations"] = cited
        if trim and response.status_code < 400:
            trim_capped_choices(payload)
        return JSONResponse(payload, status_code=response.status_code, headers=timing_headers(request))

    # ---- chat ----------------------------------------------------------------------------
    def _count_chat_tokens(self, model: str, messages: list) -> int:
        flat = [{**m, "content": _text_of(m.get("content"))} for m in messages]
        try:
            ids = self._engines[model].tokenizer.apply_chat_template(flat, tokenize=True, add_generation_prompt=True)
        except Exception as exc:  # a malformed message shape is the client's mistake
            raise HTTPException(400, f"messages could not be rendered with the chat template: {exc}")
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return len(ids)

    def _refuse_if_too_long(self, tokens: int, body) -> None:
        wanted = getattr(body, "max_completion_tokens", None) or body.max_tokens or 1
        context = self._engines[body.model].max_model_len
        if tokens >= context or tokens + wanted > context:
            raise HTTPException(
                400,
                f"prompt is {tokens} tokens and max_tokens is {wanted}; together they exceed the model's "
                f"context of {context} tokens. Shorten the prompt or lower max_tokens.",
            )

    def _check_choices(self, body) -> int:
        """`n` (and `best_of`) multiply the work of one request: bounded, and part of the estimate."""
        limit = self._settings.max_choices
        choices = max(getattr(body, "n", None) or 1, getattr(body, "best_of", None) or 1)
        if choices > limit:
            field = "n" if (getattr(body, "n", None) or 1) >= (getattr(body, "best_of", None) or 1) else "best_of"
            raise HTTPException(
                400, f"{field} is {choices}; the limit is {limit} choices per request (gateway.max_choices)"
            )
        return choices

    def _completion_budget(self, body, prompt_tokens: int, default: int | None) -> int:
        wanted = getattr(body, "max_completion_tokens", None) or body.max_tokens or default
        return wanted if wanted is not None else max(1, self._engines[body.model].max_model_len - prompt_tokens)

    @staticmethod
    def _fit_default_budget(body, request: Request, prompt_tokens: int, budget: int, choices: int) -> tuple[int, str]:
        """A chat without max_tokens may answer what the context leaves; for a tenant whose TPM is smaller than
        that, at most what the TPM leaves after the prompt (the engine is told, so the answer stops there and
        the estimate holds). Without this, such a chat would be "too large" for a TPM it never asked for.
        A client's own max_tokens is never changed: over the TPM, it is refused."""
        what = "prompt + max_tokens x n"
        if getattr(body, "max_completion_tokens", None) or body.max_tokens:
            return budget, what
        what += "; max_tokens not given: what the model's context leaves"
        tpm = tpm_of(request)
        if tpm is None or prompt_tokens + budget * choices <= tpm:
            return budget, what
        fitted = max(1, (tpm - prompt_tokens) // choices)  # below 1 the prompt alone is too large: refused
        body.max_tokens = fitted
        return fitted, what + ", at most what the tenant's TPM leaves after the prompt"

    async def _check_prompt_fits(self, body: ChatCompletionRequest, request: Request) -> None:
        """400 for a prompt that does not fit, else charge its estimate (prompt + max_tokens x n) to TPM
        (429 when the minute cannot hold it, "Request too large" when no minute could)."""
        choices = self._check_choices(body)
        tokens = await self._check_prompt_length(body)
        budget, what = self._fit_default_budget(
            body, request, tokens, self._completion_budget(body, tokens, None), choices
        )
        await reserve_tokens(request, tokens + budget * choices, what)
        self._salt(body, request)

    async def _check_prompt_length(self, body: ChatCompletionRequest) -> int:
        """The prompt's tokens; 400 when it and max_tokens do not fit the model's context."""
        # Tokenizing a multi-megabyte prompt takes a while: keep it off the event loop.
        tokens = await run_in_threadpool(self._count_chat_tokens, body.model, [dict(m) for m in body.messages])
        self._refuse_if_too_long(tokens, body)
        return tokens

    async def _check_completion_fits(self, body: CompletionRequest, request: Request) -> None:
        choices = self._check_choices(body)
        prompts = body.prompt if isinstance(body.prompt, list) else [body.prompt]
        if prompts and all(isinstance(p, int) for p in prompts):
            prompts = [prompts]  # one prompt given as token ids
        if len(prompts) > self._settings.max_prompts:  # more than one request may carry: it can never fit
            raise HTTPException(
                413,
                f"prompt is a list of {len(prompts)} prompts; the limit is "
                f"{self._settings.max_prompts} (gateway.max_prompts)",
            )
        estimate = 0
        for prompt in prompts:
            if isinstance(prompt, str):
                tokens = len(await run_in_threadpool(self._engines[body.model].tokenizer.encode, prompt))
            elif isinstance(prompt, list):  # token ids
                tokens = len(prompt)
            else:
                continue
            self._refuse_if_too_long(tokens, body)
            estimate += tokens + self._completion_budget(body, tokens, VLLM_COMPLETION_MAX_TOKENS) * choices
        await reserve_tokens(request, estimate)
        self._salt(body, request)

    @staticmethod
    def _salt(body, request: Request) -> None:
        """Each tenant gets its own prefix-cache namespace, so one tenant cannot learn from cache-hit
        timing what another tenant's prompts (RAG context) contained. A client's own salt only splits
        its tenant's namespace further."""
        tenant = tenant_of(request)
        if tenant is None:
            return
        own = getattr(body, "cache_salt", None) or ""
        body.cache_salt = hashlib.sha256(f"poolserve-tenant\0{tenant.name}\0{own}".encode()).hexdigest()

    async def chat(self, body: ChatCompletionRequest, request: Request) -> Response:
        rag = (body.model_extra or {}).pop("rag", None)
        model = await self._require_model(request, body.model)  # 404/403 before any retrieval
        if model == self._embed_model_id:
            raise HTTPException(400, f"model {model!r} is an embedding model; use /v1/embeddings")
        body.model = model
        usage_wanted = force_stream_usage(body)
        cited = None
        if rag is not None:
            options = RagOptions.model_validate(rag)
            if not (getattr(body, "max_completion_tokens", None) or body.max_tokens):
                body.max_tokens = self._settings.answer_max_tokens  # a RAG answer's default, as /v1/rag/query's
            body.messages, grounding = await self._augment_chat(
                request, options, [dict(m) for m in body.messages], model
            )
            cited = grounding.citations
            if not grounding.answerable:  # nothing related in the knowledge base: the fixed reply, no generation
                response = await self._no_answer(
                    request,
                    model,
                    body.messages,
                    body.max_completion_tokens or body.max_tokens,
                    body.stream,
                    self._check_choices(body),
                )
                return await self._finish(request, model, response, cited, usage_wanted)
        await self._check_prompt_fits(body, request)
        return await self._generate(
            request, model, super().chat(body, without_credentials(request)), body, cited, usage_wanted
        )

    async def completions(self, body: CompletionRequest, request: Request) -> Response:
        model = await self._require_model(request, body.model)
        body.model = model
        usage_wanted = force_stream_usage(body)
        await self._check_completion_fits(body, request)
        return await self._generate(
            request, model, super().completions(body, without_credentials(request)), body, None, usage_wanted
        )

    # ---- embeddings ----------------------------------------------------------------------
    async def embeddings(self, body: EmbeddingRequest, request: Request) -> Response:
        model = body.model or self._embed_model_id
        await self._require_model(request, model)
        if model != self._embed_model_id:
            raise HTTPException(
                400, f"model {body.model!r} is a chat model; embeddings come from {self._embed_model_id!r}"
            )
        texts = getattr(body, "input", None)
        if isinstance(texts, str):
            texts = [texts]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise HTTPException(400, "input must be a non-empty string or list of strings (token ids are not accepted)")
        if len(texts) > self._settings.max_embedding_inputs:  # more than one request may carry: it can never fit
            raise HTTPException(
                413,
                f"input has {len(texts)} items; the limit is {self._settings.max_embedding_inputs} "
                "(gateway.max_embedding_inputs)",
            )
        if getattr(body, "dimensions", None):
            raise HTTPException(400, f"dimensions is not supported: {self._embed_model_id} has one output size")
        # Reserved before it runs (a 429 when the tenant's minute cannot hold it, "Request too large" when no
        # minute could), settled to the real count.
        await reserve_tokens(
            request,
            estimate_text_tokens(texts, self._settings.embed_max_seq_tokens),
            "characters / 4 of each input, at most embed_max_seq_tokens each",
        )
        # Runs to the end even if the client hangs up: the work is paid for, and the tenant's
        # concurrency slot stays held until the embedder is done with it.
        result = await run_to_completion(self._embed_and_charge(request, texts))
        vectors: np.ndarray = result["vectors"]
        as_base64 = getattr(body, "encoding_format", "float") == "base64"
        usage = {"prompt_tokens": result["tokens"], "total_tokens": result["tokens"]}
        # Rendering up to millions of floats takes a while: off the event loop, so streams keep flowing.
        content = await run_in_threadpool(_embeddings_body, vectors, as_base64, self._embed_model_id, usage)
        return Response(content, media_type="application/json", background=release_heap_after_sending())


def _public_pool_state(request: Request) -> dict:
    """Whether the pool guard sheds: all /healthz tells anyone. Its bytes and the cgroup's path are on
    /status (admin key)."""
    return {"state": guard_of(request).pool.describe()["state"]}


def _embeddings_body(vectors: np.ndarray, as_base64: bool, model: str, usage: dict) -> bytes:
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode() if as_base64 else v.tolist(),
        }
        for i, v in enumerate(vectors)
    ]
    return json.dumps({"object": "list", "data": data, "model": model, "usage": usage}).encode()


def _text_of(content) -> str:
    """Message content as text, for counting: OpenAI content parts are flattened like vLLM does."""
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""
