"""Per-tenant request, token and concurrency limits, enforced in one process.

RPM: every admitted request counts 1 in a moving 60 s window
(MovingWindowRateLimiter), so there is no burst at window edges.

TPM: a fixed 60 s window (FixedWindowRateLimiter), chosen on purpose:
  * tokens are only known after generation, and a fixed window's counter
    always accepts the charge (it increments even past the limit), whereas a
    moving window refuses to record a charge that does not fit, losing it;
  * MemoryStorage's moving window keeps one list entry per unit of cost, which
    for a TPM in the hundreds of thousands is a large list per tenant.
The flow is: ``check_request`` admits a request only if its estimate
(prompt tokens + max_tokens) fits what is left in the window (an estimate
above the whole TPM is capped to the TPM, so an oversized request can still
run in an unused window); afterwards ``charge_tokens`` adds the actual
tokens. Overshoot by in-flight requests is possible and bounded by the
concurrency cap.

Concurrency: in-instance counters; at the cap a request is rejected, never
queued. State lives in the limiter instance, so one gateway replica enforces
its own share; the limits are per replica, not global.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from limits import RateLimitItemPerMinute
from limits.storage import MemoryStorage
from limits.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter

from tenancy.models import Tenant

RejectReason = Literal["rpm", "tpm", "concurrency"]
# When the concurrency cap is hit there is no window to wait for; ask for a short retry.
CONCURRENCY_RETRY_AFTER_SECONDS = 1


@dataclass(frozen=True)
class LimitDecision:
    allowed: bool
    reason: RejectReason | None = None  # set when allowed is False
    retry_after_seconds: int = 0  # >= 1 when allowed is False; for the Retry-After header

    @classmethod
    def allow(cls) -> LimitDecision:
        return cls(allowed=True)

    @classmethod
    def reject(cls, reason: RejectReason, retry_after_seconds: int) -> LimitDecision:
        return cls(allowed=False, reason=reason, retry_after_seconds=max(1, retry_after_seconds))


def _requests_per_minute(amount: int) -> RateLimitItemPerMinute:
    # Distinct namespaces keep the RPM and TPM keys apart in the shared storage.
    return RateLimitItemPerMinute(amount, namespace="poolserve-rpm")


def _tokens_per_minute(amount: int) -> RateLimitItemPerMinute:
    return RateLimitItemPerMinute(amount, namespace="poolserve-tpm")


def _seconds_until(reset_time: float, now: float) -> int:
    return max(1, math.ceil(reset_time - now))


class TenantLimiter:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        # ``clock`` must match the one limits' MemoryStorage uses (time.time);
        # it is only a parameter so that retry_after stays testable.
        self._clock = clock
        self._storage = MemoryStorage()
        self._requests = MovingWindowRateLimiter(self._storage)
        self._tokens = FixedWindowRateLimiter(self._storage)
        self._in_flight: dict[str, int] = {}
        self._in_flight_lock = threading.Lock()
        # check_request tests TPM then hits RPM; serialise so two requests
        # cannot both pass the test for the last tokens of a window.
        self._check_lock = threading.Lock()

    # ---- rate limits ---------------------------------------------------------

    def check_request(self, tenant: Tenant, estimated_tokens: int = 0) -> LimitDecision:
        """Admit or reject one request; an admitted request is counted for RPM.

        ``estimated_tokens`` is prompt tokens + max_tokens when known (0 skips
        the TPM pre-check). TPM is tested first and charged nothing, so a
        request refused for TPM does not use up an RPM slot.
        """
        with self._check_lock:
            if tenant.tpm is not None and estimated_tokens > 0:
                tokens_item = _tokens_per_minute(tenant.tpm)
                needed = min(estimated_tokens, tenant.tpm)
                if not self._tokens.test(tokens_item, tenant.name, cost=needed):
                    reset_time = self._tokens.get_window_stats(tokens_item, tenant.name).reset_time
                    return LimitDecision.reject("tpm", _seconds_until(reset_time, self._clock()))
            if tenant.rpm is not None:
                requests_item = _requests_per_minute(tenant.rpm)
                if not self._requests.hit(requests_item, tenant.name):
                    reset_time = self._requests.get_window_stats(requests_item,
                                                                 tenant.name).reset_time
                    return LimitDecision.reject("rpm", _seconds_until(reset_time, self._clock()))
        return LimitDecision.allow()

    def charge_tokens(self, tenant: Tenant, tokens: int) -> None:
        """Add the tokens a finished request actually used to the TPM window."""
        if tenant.tpm is None or tokens <= 0:
            return
        # FixedWindow.hit always increments, so an overshoot is still recorded
        # and later requests wait for the window to reset.
        self._tokens.hit(_tokens_per_minute(tenant.tpm), tenant.name, cost=tokens)

    def tokens_remaining(self, tenant: Tenant) -> int | None:
        """Tokens left in the current TPM window; None when unlimited."""
        if tenant.tpm is None:
            return None
        return self._tokens.get_window_stats(_tokens_per_minute(tenant.tpm),
                                             tenant.name).remaining

    # ---- concurrency ---------------------------------------------------------

    def try_acquire(self, tenant: Tenant) -> LimitDecision:
        """Take an in-flight slot; on success the caller must ``release`` it exactly once."""
        with self._in_flight_lock:
            current = self._in_flight.get(tenant.name, 0)
            if tenant.max_concurrency is not None and current >= tenant.max_concurrency:
                return LimitDecision.reject("concurrency", CONCURRENCY_RETRY_AFTER_SECONDS)
            self._in_flight[tenant.name] = current + 1
        return LimitDecision.allow()

    def release(self, tenant: Tenant) -> None:
        with self._in_flight_lock:
            remaining = self._in_flight.get(tenant.name, 0) - 1
            if remaining > 0:
                self._in_flight[tenant.name] = remaining
            else:
                # Drop the entry so idle or deleted tenants do not accumulate.
                self._in_flight.pop(tenant.name, None)

    def in_flight(self, tenant_name: str) -> int:
        with self._in_flight_lock:
            return self._in_flight.get(tenant_name, 0)
