"""Layers 3 (high concurrency), 4 (mixed lengths) and 6 (throttling, sampled through 3 and 4)."""

from __future__ import annotations

import random
import time

from stress.client import QUESTIONS
from stress.context import COLLECTION, RunContext
from stress.load import Sampler, error_examples, run_clients, summarize
from stress.measure import latency_summary
from stress.prompts import PromptSizer, filler_prompt
from stress.basic import drift_checks, drift_rule
from stress.report import LayerResult
from stress.thermal import find_reader, judge

MEMORY_INTERVAL_S = (15.0, 5.0)  # full, quick
THERMAL_INTERVAL_S = 2.0
# Layer 4's mix, per 10 requests: 3 short, 5 medium, 2 long (shuffled with a fixed seed).
MIX = ["short"] * 3 + ["medium"] * 5 + ["long"] * 2


def start_thermal(ctx: RunContext) -> None:
    reader, source = find_reader()
    ctx.thermal.update(source=source, started=time.monotonic())
    if reader:
        sampler = Sampler(reader, THERMAL_INTERVAL_S)
        ctx.thermal["sampler"] = sampler.__enter__()


def stop_thermal(ctx: RunContext) -> None:
    sampler = ctx.thermal.get("sampler")
    if sampler:
        sampler.__exit__(None, None, None)
    ctx.thermal["stopped"] = time.monotonic()


def mixed_operation(ctx: RunContext, gateways: list):
    """Per 10 requests: 4 chats, 2 RAG queries, 3 embeddings, 1 small ingest; clients spread over tenants."""

    def operation(client: int, n: int):
        gw = gateways[client % len(gateways)]
        kind = n % 10
        if kind < 4:
            return gw.chat(f"Write one short sentence about the number {n}.", 24)
        if kind < 6:
            return gw.rag(COLLECTION, QUESTIONS[n % len(QUESTIONS)])
        if kind < 9:
            return gw.embed(f"Concurrent embedding request {n}.")
        doc_id = f"load-{n}"
        outcome = gw.ingest(COLLECTION, [{"id": doc_id, "text": f"Load note {n}: the stress test wrote this."}])
        if outcome.kind == "ok":
            ctx.acknowledge(gw.tenant, doc_id)
        return outcome

    return operation


def layer3(ctx: RunContext, result: LayerResult) -> None:
    spec = ctx.spec
    seconds = spec.quick_concurrency_seconds if ctx.quick else spec.concurrency_seconds
    warmup = min(spec.warmup_seconds, seconds / 4)
    result.thresholds = {
        "clients": spec.concurrency_clients,
        "seconds": seconds,
        "tenants": len(ctx.tenants),
        "errors other than 429/503": 0,
        "client timeouts": f"0 (timeout {spec.client_timeout_s:g} s)",
        "memory drift": drift_rule(spec),
    }
    gateways = [ctx.gateway(tenant) for tenant in ctx.tenants]
    started = time.monotonic()
    try:
        with Sampler(ctx.admin.replica_memory, MEMORY_INTERVAL_S[ctx.quick]) as memory:
            outcomes = run_clients(spec.concurrency_clients, mixed_operation(ctx, gateways), seconds=seconds)
    finally:
        for gw in gateways:
            gw.close()
    table = summarize(outcomes)
    result.figures["per route"] = table
    result.figures["requests per second"] = round(len(outcomes) / max(1e-9, time.monotonic() - started), 2)
    errors = sum(row["errors"] for row in table.values())
    timeouts = sum(row["timeouts"] for row in table.values())
    result.check("no errors other than 429/503", errors == 0, "; ".join(error_examples(outcomes)) or f"{errors}")
    result.check("no client timeouts", timeouts == 0, f"{timeouts}")
    result.check("every route answered", all(row["ok"] > 0 for row in table.values()), ", ".join(table))
    samples = memory.values_since(started + warmup)
    result.notes += memory.misses[:3]
    drift_checks(result, samples, ctx, f"after {warmup:.0f} s of warm-up load")


def layer4(ctx: RunContext, result: LayerResult) -> None:
    spec = ctx.spec
    total = spec.quick_mixed_requests if ctx.quick else spec.mixed_requests
    concurrency = spec.quick_mixed_concurrency if ctx.quick else spec.mixed_concurrency
    answer = 16
    sizes = {
        "short": spec.short_prompt_tokens,
        "medium": spec.medium_prompt_tokens,
        "long": min(spec.long_prompt_tokens, ctx.max_model_len - answer - 8),
    }
    result.thresholds = {
        "concurrency": concurrency,
        "requests": total,
        "mix": "30% short, 50% medium, 20% long",
        "prompt tokens": sizes,
        "short p95": f"<= {spec.short_p95_s:g} s",
        "errors": 0,
    }
    gw = ctx.gateway(ctx.tenants[0])
    try:
        sizer = PromptSizer(gw.http, gw.chat_model)
        units = {bucket: sizer.estimate_units(tokens) for bucket, tokens in sizes.items()}
        # Each run of ten is the whole mix, shuffled: any prefix of whole tens keeps the 3:5:2 shares.
        rng = random.Random(14)
        order = [bucket for _ in range(total // len(MIX) + 1) for bucket in rng.sample(MIX, len(MIX))]

        def operation(_client: int, n: int):
            bucket = order[n]
            # A distinct first line per request: no two share a cached prefix.
            outcome = gw.chat(filler_prompt(units[bucket], tag=f"Request {n}. "), answer)
            return outcome.__class__(
                bucket, outcome.status, outcome.seconds, outcome.kind, outcome.detail, outcome.started
            )

        outcomes = run_clients(concurrency, operation, total=total)
    finally:
        gw.close()
    table = {}
    for bucket in ("short", "medium", "long"):
        mine = [o for o in outcomes if o.route == bucket]
        table[bucket] = {
            "requests": len(mine),
            "failed": sum(o.kind != "ok" for o in mine),
            **latency_summary([o.seconds for o in mine if o.kind == "ok"]),
        }
        table[bucket].pop("count", None)
    result.figures["per length bucket"] = table
    failed = sum(row["failed"] for row in table.values())
    result.check("every request answered", failed == 0, "; ".join(error_examples(outcomes)) or "0 failed")
    short_p95 = table["short"].get("p95_s")
    result.check(
        "short prompts do not starve",
        short_p95 is not None and short_p95 <= spec.short_p95_s,
        f"short p95 {short_p95} s",
    )


def layer6(ctx: RunContext, result: LayerResult) -> None:
    spec = ctx.spec
    result.thresholds = {
        "sustained clock drop": f"> {spec.clock_drop_fraction:.0%} for >= {spec.clock_drop_seconds:g} s",
        "max temperature": f"{spec.max_temperature_c} C" if spec.max_temperature_c else "not set",
    }
    if "started" not in ctx.thermal:
        result.verdict = "not run"
        result.notes.append("layer 6 samples during layers 3 and 4; neither ran")
        return
    result.figures["source"] = ctx.thermal["source"]
    sampler = ctx.thermal.get("sampler")
    if sampler is None:
        result.verdict = "not measurable"
        result.notes.append(f"not measurable here: {ctx.thermal['source']}")
        return
    figures, checks = judge(sampler.samples, spec.clock_drop_fraction, spec.clock_drop_seconds, spec.max_temperature_c)
    result.figures["sensors"] = figures
    result.figures["sampled seconds"] = round(ctx.thermal.get("stopped", time.monotonic()) - ctx.thermal["started"])
    for name, ok, detail in checks:
        result.check(name, ok, detail)
    if not checks:
        result.verdict = "not measurable"
        result.notes.append("the sensors found report no clock to judge")
