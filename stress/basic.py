"""Layers 1 (single-request stability) and 2 (long context)."""

from __future__ import annotations

import json
import secrets
import time
from functools import partial

from stress.client import QUESTIONS
from stress.context import COLLECTION, RunContext
from stress.load import summarize
from stress.measure import memory_drift
from stress.prompts import PromptSizer
from stress.report import LayerResult

WARMUP_REQUESTS = 3
MEMORY_EVERY = 10  # requests of each kind between two /status reads


def drift_rule(spec) -> str:
    return (
        f"each replica's planned growth (budget - at-rest, /status); where the plan gives none, "
        f"{spec.memory_drift_fraction:.0%} or {spec.memory_drift_bytes / 2**20:.0f} MiB, whichever is larger"
    )


def drift_checks(result: LayerResult, samples: list[dict[str, int]], ctx: RunContext, label: str) -> None:
    try:  # the plan's growth line per replica, read once: a threshold from the plan, not a constant
        planned = ctx.admin.replica_growth_budgets()
    except Exception as exc:  # an older stack's /status: the profile's fallback rule (noted)
        planned = {}
        result.notes.append(f"no planned growth from /status ({type(exc).__name__}); drift judged by the fallback rule")
    drifts = memory_drift(samples, ctx.spec.memory_drift_fraction, ctx.spec.memory_drift_bytes, planned_growth=planned)
    result.figures[f"memory drift ({label}, {len(samples)} /status reads)"] = [d.as_dict() for d in drifts]
    # The whole series, so a fail shows its shape: a step (a cache filling once) or a slope (a leak).
    result.figures["memory series (MiB)"] = {
        d.replica: [round(s[d.replica] / 2**20) for s in samples if d.replica in s] for d in drifts
    }
    result.check("memory read from /status", bool(drifts), f"{len(drifts)} replicas")
    for drift in drifts:
        d = drift.as_dict()
        result.check(
            f"{drift.replica} memory flat",
            drift.ok,
            f"{d['growth_mib']:+} MiB ({d['growth_pct']}%) allowed {d['allowed_mib']} MiB",
        )


def layer1(ctx: RunContext, result: LayerResult) -> None:
    count = ctx.spec.quick_sequential_requests if ctx.quick else ctx.spec.sequential_requests
    tenant = ctx.tenants[0]
    gw = ctx.gateway(tenant)
    result.thresholds = {"requests per kind": count, "memory drift": drift_rule(ctx.spec)}
    calls = (
        lambda i: gw.chat(f"Name one colour. ({i})", 16),
        lambda i: gw.rag(COLLECTION, QUESTIONS[i % len(QUESTIONS)]),
        lambda i: gw.embed(f"A sentence to embed, number {i}."),
    )
    try:
        for i in range(WARMUP_REQUESTS):
            for call in calls:
                call(i)
        samples, outcomes = [ctx.admin.replica_memory()], []
        for i in range(count):
            for call in calls:
                outcomes.append(call(i))
            if (i + 1) % MEMORY_EVERY == 0 or i + 1 == count:
                samples.append(ctx.admin.replica_memory())
    finally:
        gw.close()
    table = summarize(outcomes)
    result.figures["latency per route (sequential)"] = table
    for route, row in table.items():
        result.check(
            f"{route}: every request answered",
            row["errors"] == 0 and row["timeouts"] == 0 and row["ok"] == count,
            f"{row['ok']}/{count} ok, {row['errors']} errors, {row['timeouts']} timeouts",
        )
    drift_checks(result, samples, ctx, f"after {WARMUP_REQUESTS} warm-up requests of each kind")


def fresh_salt() -> str:
    """A prefix-cache namespace of its own: the sizing probes already sent this prompt, and a cache hit
    would measure no prefill at all."""
    return secrets.token_hex(8)


def _stream(gw, content: str, max_tokens: int) -> dict:
    """One streamed chat: time to first token, decode rate, the text and the final usage."""
    body = {
        "model": gw.chat_model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "cache_salt": fresh_salt(),
    }
    started, first, text, usage, done = time.monotonic(), None, "", None, False
    with gw.http.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            return {"status": response.status_code, "error": response.read().decode()[:200]}
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                done = True
                break
            event = json.loads(data)
            if event.get("usage"):
                usage = event["usage"]
            for choice in event.get("choices", []):
                piece = (choice.get("delta") or {}).get("content") or ""
                if piece and first is None:
                    first = time.monotonic()
                text += piece
    ended = time.monotonic()
    completion = (usage or {}).get("completion_tokens", 0)
    decode = (completion - 1) / (ended - first) if first and completion > 1 and ended > first else None
    return {
        "status": 200,
        "done": done,
        "usage": usage,
        "text": text,
        "ttft_s": round(first - started, 3) if first else None,
        "decode_tok_s": round(decode, 1) if decode else None,
        "seconds": round(ended - started, 3),
    }


def _plain(gw, content: str, max_tokens: int, cached: bool = False) -> dict:
    """One chat. `cached`: without a fresh salt, so it reuses the prefix the sizer's last probe prefilled."""
    body = {
        "model": gw.chat_model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        **({} if cached else {"cache_salt": fresh_salt()}),
    }
    started = time.monotonic()
    response = gw.http.post("/v1/chat/completions", json=body)
    seconds = time.monotonic() - started
    if response.status_code != 200:
        return {"status": response.status_code, "error": response.text[:200]}
    data = response.json()
    text = data["choices"][0]["message"].get("content") or ""
    return {"status": 200, "usage": data["usage"], "text": text, "seconds": round(seconds, 3), "done": True}


def layer2(ctx: RunContext, result: LayerResult) -> None:
    limit, answer_tokens = ctx.max_model_len, 32
    fractions = ctx.spec.quick_long_context_fractions if ctx.quick else ctx.spec.long_context_fractions
    result.thresholds = {
        "max_model_len": limit,
        "prompt + max_tokens": [f"{f:.0%}" for f in fractions],
        "max_tokens": answer_tokens,
        "over the limit by one token": "400",
    }
    if ctx.quick:  # one whole-context prefill (the streamed request's); the plain one reuses the sizer's
        result.thresholds["plain"] = "the sizer's cached prefix (--quick)"
    gw = ctx.gateway(ctx.tenants[0])
    rows, at_limit = [], None
    try:
        sizer = PromptSizer(gw.http, gw.chat_model)
        result.figures["prompt sizing"] = f"{sizer.per_unit:g} tokens per unit, {sizer.overhead} tokens of template"
        for fraction in fractions:
            target = int(fraction * limit) - answer_tokens
            content, tokens = sizer.exact(target, tag=f"[{fraction:.2f}] ")
            if fraction >= 1.0:
                at_limit = (content, tokens)
            plain = partial(_plain, cached=ctx.quick)
            for mode, call in (("plain", plain), ("stream", _stream)):
                got = call(gw, content, answer_tokens)
                usage = got.get("usage") or {}
                row = {
                    "context": f"{fraction:.0%}",
                    "mode": mode,
                    "prompt_tokens": usage.get("prompt_tokens"),
                    "completion_tokens": usage.get("completion_tokens"),
                    "seconds": got.get("seconds"),
                    "ttft_s": got.get("ttft_s"),
                    "decode_tok_s": got.get("decode_tok_s"),
                }
                rows.append(row)
                name = f"{fraction:.0%} {mode}"
                if not result.check(
                    f"{name}: answered", got.get("status") == 200 and got.get("done"), got.get("error", "")
                ):
                    continue
                result.check(
                    f"{name}: prompt not truncated",
                    usage.get("prompt_tokens") == tokens,
                    f"sent {tokens} tokens, usage says {usage.get('prompt_tokens')}",
                )
                adds_up = usage.get("total_tokens") == usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
                result.check(f"{name}: usage adds up", adds_up, json.dumps(usage))
                result.check(
                    f"{name}: answer continues after the prompt",
                    usage.get("completion_tokens", 0) >= 1 and bool(got.get("text", "").strip()),
                    f"{usage.get('completion_tokens')} tokens: {got.get('text', '')[:60]!r}",
                )
        result.figures["long prompts"] = rows
        if at_limit is None:
            content, tokens = sizer.exact(limit - answer_tokens, tag="[1.00] ")
        else:
            content, tokens = at_limit
        response = gw.http.post(
            "/v1/chat/completions",
            json={
                "model": gw.chat_model,
                "messages": [{"role": "user", "content": content}],
                "max_tokens": limit - tokens + 1,
            },
        )
        result.figures["one token over"] = (
            f"prompt {tokens} + max_tokens {limit - tokens + 1} = {limit + 1}: "
            f"{response.status_code} {response.text[:160]}"
        )
        result.check("one token over the limit: clean 400", response.status_code == 400, f"{response.status_code}")
    finally:
        gw.close()
