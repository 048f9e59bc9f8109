"""The tenant guard: what one gateway replica holds for its tenants, and what a request charges them.

TenantGuard holds the tenant store, the limiter, the metrics, the pool guard, the read lanes and the
limits on unauthenticated traffic; the auth middleware (gateway/middleware/tenant_auth.py) builds it and
puts it, the request's tenant and its TPM reservation in the request's scope. The routes read them back
here: tenant_of, guard_of, reserve_tokens before work runs, record_usage when it is done, detach for work
that outlives the response. The pure logic (hashing, SQLite, limiter maths) lives in `tenancy/`.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
from pathlib import Path

from fastapi import HTTPException, Request
from prometheus_client import CollectorRegistry
from starlette.concurrency import run_in_threadpool

from gateway.middleware.pool_guard import PoolGuard, read_gpu_pool, read_pool
from gateway.middleware.read_lanes import ReadLanes
from planner.guard import GuardPlan, unplanned_guard
from planner.profile import GatewaySpec
from system.private_files import make_private_dir, write_private
from tenancy import (
    DEMO_KEY_ENV,
    TenantLimiter,
    TenantMetrics,
    TenantStore,
    apply_tenants_file,
    load_tenants_file,
    parse_api_key,
    resolve_demo_key,
)
from tenancy.client_limits import ClientLimiter
from tenancy.limits import LimitDecision
from tenancy.rejections import RejectionLog

logger = logging.getLogger("poolserve.tenants")
ADMIN_KEY_ENV = "POOLSERVE_ADMIN_KEY"
# The tenants file seeds once; with this set to 1 it is applied again (revoked keys stay revoked).
RESEED_ENV = "POOLSERVE_RESEED_TENANTS"
# Per-request scope keys. Not scope["state"]: servers may share that dict across requests.
TENANT_KEY = "poolserve.tenant"
GUARD_KEY = "poolserve.guard"
TOKENS_KEY = "poolserve.tokens"  # the request's TPM reservation, settled once its usage is known
DETACHED_KEY = "poolserve.detached"  # work that outlives the response (an ingest job): see detach()


def tenant_of(request: Request):
    """The authenticated tenant of a /v1 request (set by TenantAuthMiddleware), or None."""
    return request.scope.get(TENANT_KEY)


def detach(request: Request, task: asyncio.Task) -> None:
    """The request's work goes on in `task` after its response (an ingest job). Its concurrency slot is
    given back with the response, so the tenant can follow and cancel the job (jobs have their own
    limit, rag.max_ingest_jobs_per_tenant); its TPM reservation is held until the task ends, then
    settled to what the work used."""
    request.scope[DETACHED_KEY] = task


def guard_of(request: Request) -> "TenantGuard":
    return request.scope[GUARD_KEY]


class TenantGuard:
    """Everything tenant-related one gateway replica holds: store, limiter, metrics."""

    def __init__(
        self,
        state_dir: str,
        tenants_file: str | None,
        marks: GuardPlan | None = None,
        gateway: GatewaySpec | None = None,
    ):
        """`marks` is the plan's pool guard section (planner/guard.py): the marks follow what the plan holds.
        None (unit tests that build a guard alone): the profile schema's fixed marks."""
        marks = marks or unplanned_guard()
        os.umask(0o077)  # tenants, usage and audit databases and key files are the owner's only
        self.state_dir = Path(state_dir)
        self.store = TenantStore(self.state_dir / "tenants.sqlite3")
        # One SQLite file shared by every gateway replica: a tenant's limits hold across replicas.
        self.limiter = TenantLimiter(self.state_dir / "limits.sqlite3")
        self.registry = CollectorRegistry()
        self.metrics = TenantMetrics(self.registry)
        self.rejections = RejectionLog(self.state_dir / "rejections.sqlite3")  # 429s per tenant and day
        # Sheds new work with 503 before the memory pool runs out (the kernel's OOM killer never decides).
        # On a discrete GPU the pool is the device's memory (planner: unified false), read through NVML.
        self.pool = PoolGuard(
            marks.shed_ingest_at,
            marks.shed_all_at,
            hysteresis=marks.hysteresis,
            sample_interval_s=marks.sample_interval_s,
            retry_after_s=marks.retry_after_s,
            registry=self.registry,
            reader=read_gpu_pool if marks.reader == "gpu" else read_pool,
            planned_bytes=marks.planned_bytes,
            basis=marks.basis,
        )
        self.shed_heaviest_at_least = marks.heaviest_at_least
        self.admin_key = os.environ.get(ADMIN_KEY_ENV) or None
        # Traffic without a valid key, per client address (planner/profile.py GatewaySpec.client_*).
        spec = gateway or GatewaySpec()
        self.clients = ClientLimiter(
            spec.client_max_concurrent,
            spec.client_requests_per_minute,
            spec.login_failures_per_minute,
            spec.tracked_clients,
        )
        self.login_form_max_bytes = spec.login_form_max_bytes
        self.lanes = ReadLanes(
            spec.reads_at_once_alone, spec.reads_queue_max, spec.reads_wait_s, spec.reads_pause_ratio
        )
        demo_key, created_at = resolve_demo_key(self.state_dir)
        if created_at:
            logger.warning("demo tenant key written to %s (mode 0600)", created_at)
        if tenants_file:
            applied = apply_tenants_file(
                self.store,
                load_tenants_file(tenants_file),
                {**os.environ, DEMO_KEY_ENV: demo_key},
                reseed=os.environ.get(RESEED_ENV) == "1",
            )
            for name, key in applied.new_keys.items():
                logger.warning("key for tenant %s written to %s (mode 0600)", name, self._write_key_file(name, key))
            logger.info("tenants file %s: synced %s", tenants_file, ", ".join(applied.synced) or "nothing")
            for warning in applied.warnings:
                logger.warning("tenants file: %s", warning)

    def _write_key_file(self, tenant: str, key: str) -> Path:
        path = self.state_dir / "keys" / f"{tenant}.key"
        make_private_dir(path.parent)
        return write_private(path, key + "\n", exclusive=False)  # a key written before is replaced

    def admin_allowed(self, presented: str | None) -> bool:
        return bool(self.admin_key and presented and hmac.compare_digest(presented.encode(), self.admin_key.encode()))

    def authenticate(self, presented: str | None):
        """The key's tenant, or None. Keys are checked by SHA-256 (microseconds), so a flood of
        wrong secrets against a key id costs little and never locks the real key out."""
        try:
            parse_api_key(presented or "")
        except ValueError:
            return None
        return self.store.authenticate(presented)

    def observe_rejection(self, tenant: str, reason: str) -> None:
        """A 429 from a tenant limit: counted in Prometheus (this process) and per day (every replica)."""
        self.metrics.observe_rejection(tenant, reason)
        self.rejections.record(tenant, reason)

    def admit(self, tenant):
        """A concurrency lease and an RPM slot in one transaction (a spent TPM minute refuses; the estimate
        is reserved later, by reserve_tokens), or the refusal."""
        return self.limiter.acquire_and_admit(tenant, estimated_tokens=1, reserve=False)


# OpenAI's clients retry a 429 unless told not to: a request too large for the TPM fails the same way every time.
NO_RETRY = {"x-should-retry": "false"}


def over_limit_message(tenant, decision, what: str | None = None) -> str:
    """The 429's message. TPM refusals name the limit and the request's estimate (and the minute's use), in
    OpenAI's words ("Request too large ... Limit 20000, Requested 47352"); `what` says how it was estimated."""
    how = f" ({what})" if what else ""
    if decision.reason == "request_too_large":
        return (
            f"Request too large for tenant {tenant.name!r} on tokens per minute (TPM): Limit {decision.limit}, "
            f"Requested {decision.requested}. This request is estimated at {decision.requested} tokens{how}, "
            "more than the tenant may use in a minute, so it can never run: reduce the input or max_tokens, "
            "or ask for a higher tpm. Nothing was charged."
        )
    what_limit = {
        "rpm": f"{tenant.rpm} requests per minute",
        "tpm": f"{tenant.tpm} tokens per minute",
        "concurrency": f"{tenant.max_concurrency} concurrent requests",
    }[decision.reason]
    numbers = ""
    if decision.reason == "tpm" and decision.limit is not None:
        numbers = f": Limit {decision.limit}, Used {decision.used}"
        if decision.requested is not None:
            numbers += (
                f", Requested {decision.requested} (this request is estimated at {decision.requested} "
                f"tokens{': ' + what if what else ''})"
            )
    return (
        f"tenant {tenant.name!r} is over its limit of {what_limit}{numbers}; retry after "
        f"{decision.retry_after_seconds}s"
    )


def _tpm_refusal(tenant, decision, what: str | None) -> HTTPException:
    if decision.reason == "request_too_large":
        return HTTPException(429, over_limit_message(tenant, decision, what), headers=dict(NO_RETRY))
    return HTTPException(
        429, over_limit_message(tenant, decision, what), headers={"Retry-After": str(decision.retry_after_seconds)}
    )


async def reserve_tokens(request: Request, estimated_tokens: int, what: str = "prompt + max_tokens x n") -> None:
    """Charge a request's estimate before it runs (generation: prompt + max_tokens x n; embeddings and
    ingest: characters / 4): 429 when the tenant's minute cannot hold it, naming the limit, the minute's use
    and the estimate, with Retry-After; 429 "Request too large" when no minute could (the estimate is over
    the whole TPM), without Retry-After and with `x-should-retry: false`. A refusal charges nothing. Held
    until the request ends, then settled to what it used (record_usage reports it)."""
    tenant, tokens = tenant_of(request), request.scope.get(TOKENS_KEY)
    if tenant is None or tokens is None:
        return
    guard = guard_of(request)
    admission = await run_in_threadpool(guard.limiter.reserve_more, tenant, tokens.reservation, estimated_tokens)
    if not admission.allowed:
        await run_in_threadpool(guard.observe_rejection, tenant.name, admission.decision.reason)
        raise _tpm_refusal(tenant, admission.decision, what)
    tokens.reserved(admission.reservation)


async def refuse_if_too_large(request: Request, estimated_tokens: int, what: str) -> None:
    """The "Request too large" 429 before any work, for a request whose least possible cost is already over
    the tenant's whole TPM (a RAG query before its question is embedded); nothing is reserved here."""
    tenant = tenant_of(request)
    if tenant is None or tenant.tpm is None or estimated_tokens <= tenant.tpm:
        return
    await run_in_threadpool(guard_of(request).observe_rejection, tenant.name, "request_too_large")
    raise _tpm_refusal(tenant, LimitDecision.too_large(tenant.tpm, estimated_tokens), what)


def tpm_of(request: Request) -> int | None:
    """The caller's tenant's TPM, or None (unlimited, or no tenant)."""
    tenant = tenant_of(request)
    return None if tenant is None else tenant.tpm


async def record_usage(request: Request, model: str, usage: dict | None, status: int = 200) -> None:
    """Count one finished request for the caller's tenant (tokens as the engine reported them)."""
    tenant = tenant_of(request)
    guard = request.scope.get(GUARD_KEY)
    if tenant is None or guard is None:
        return
    prompt = int((usage or {}).get("prompt_tokens") or 0)
    completion = int((usage or {}).get("completion_tokens") or 0)
    await run_in_threadpool(guard.store.record_usage, tenant.name, model, prompt, completion)
    tokens = request.scope.get(TOKENS_KEY)
    # Covered by the request's reservation up to what it holds; beyond that charged now. The rest of
    # the reservation is refunded when the request closes (TenantAuthMiddleware._close_request).
    excess = tokens.report(prompt + completion) if tokens is not None else prompt + completion
    if excess:
        await run_in_threadpool(guard.limiter.charge_tokens, tenant, excess)
    guard.metrics.observe_request(tenant.name, model, str(status))
    guard.metrics.observe_tokens(tenant.name, model, prompt, completion)
