"""Per-tenant request, token and concurrency limits, shared by every gateway process.

Why SQLite: each gateway replica is its own process, so counters kept in
process memory give a tenant N times its limits with N replicas. All replicas
on one machine open the same database file and every admission is one
``BEGIN IMMEDIATE`` transaction (test and record under SQLite's write lock),
so two processes can never both take the last slot.

RPM: a moving 60 s window; one row per admitted request, a request is
admitted iff fewer than ``rpm`` hits lie in (now - 60, now].

TPM: estimate, then settle. Tokens are only known once a request has run, so
``admit`` reserves an estimate (prompt + max_tokens when known, at least 1)
and ``settle`` corrects it to the real count. The window is a fixed minute,
keyed by floor(now / 60), because charges arrive after the fact: a counter
per minute can always absorb a late correction, where a moving window would
have to rewrite hits in the past. A limit is a limit:
- a request whose own estimate is above the whole TPM is refused
  ("request_too_large", naming the limit and the estimate) and charged nothing:
  it could never fit in a minute;
- no minute is ever charged more than the TPM. Use beyond a request's estimate
  (known only after it ran) is not lost: what the minute cannot hold is carried
  to the next minutes, each taking at most the TPM, so the tenant waits for it.
  One row per tenant holds the tokens charged from its minute on; the minute's
  own charge is min(that, TPM), the rest is the carry, and each minute that
  passes takes one TPM of it.

Concurrency: one lease row per in-flight request, holding the holder's pid.
Leases of processes that no longer exist are deleted before each acquire,
so a crashed gateway cannot hold slots forever. This assumes every process
sharing the file runs on one machine, in one pid namespace (a lease whose
pid was reused by an unrelated process stays until that process exits).
At the cap a request is rejected, never queued.
"""

from __future__ import annotations

import math
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from system.sqlite import connect
from tenancy.models import Tenant
from tenancy.sqlite_db import LockedSQLite

# "request_too_large": the request alone needs more than the whole TPM (no retry helps).
RejectReason = Literal["rpm", "tpm", "concurrency", "request_too_large"]
# When the concurrency cap is hit there is no window to wait for; ask for a short retry.
CONCURRENCY_RETRY_AFTER_SECONDS = 1
WINDOW_SECONDS = 60

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rpm_hits (tenant TEXT NOT NULL, ts REAL NOT NULL);
CREATE INDEX IF NOT EXISTS rpm_hits_by_tenant ON rpm_hits(tenant, ts);
CREATE TABLE IF NOT EXISTS tpm_minutes (
    tenant TEXT NOT NULL,
    minute INTEGER NOT NULL,    -- floor(unix time / 60)
    tokens INTEGER NOT NULL,    -- charged from this minute on: min(tokens, tpm) in it, the rest carried
    PRIMARY KEY (tenant, minute)
);
CREATE TABLE IF NOT EXISTS leases (
    lease_id TEXT PRIMARY KEY,  -- random, so a stale release can never hit a newer lease
    tenant TEXT NOT NULL,
    holder_pid INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_by_tenant ON leases(tenant);
"""


@dataclass(frozen=True)
class LimitDecision:
    allowed: bool
    reason: RejectReason | None = None  # set when allowed is False
    # >= 1 when refused for a limit that frees in time (the Retry-After header); 0 for request_too_large
    retry_after_seconds: int = 0
    lease_id: str | None = None  # try_acquire only: pass it to release()
    # TPM refusals only, for the message: the tenant's TPM, the request's estimate, and what the minute holds
    limit: int | None = None
    requested: int | None = None
    used: int | None = None

    @classmethod
    def allow(cls, lease_id: str | None = None) -> LimitDecision:
        return cls(allowed=True, lease_id=lease_id)

    @classmethod
    def reject(
        cls,
        reason: RejectReason,
        retry_after_seconds: float,
        *,
        limit: int | None = None,
        requested: int | None = None,
        used: int | None = None,
    ) -> LimitDecision:
        return cls(
            allowed=False,
            reason=reason,
            retry_after_seconds=max(1, math.ceil(retry_after_seconds)),
            limit=limit,
            requested=requested,
            used=used,
        )

    @classmethod
    def too_large(cls, limit: int, requested: int) -> LimitDecision:
        """The request alone is over the whole limit: it could never run, so there is nothing to wait for."""
        return cls(allowed=False, reason="request_too_large", limit=limit, requested=requested)


@dataclass(frozen=True)
class TokenReservation:
    """Tokens reserved by ``admit`` in one TPM minute; hand it back to ``settle``."""

    minute: int
    tokens: int


@dataclass
class RequestTokens:
    """One request's TPM account: what it reserved, what it has reported using, and what has been
    added to its tenant's minute for it. The reservation is held until the request ends (so work
    reported in parts, like an ingest's embedder calls, stays covered by it); only use beyond what
    was charged is charged at once, and the rest is refunded when the request closes."""

    reservation: TokenReservation | None
    used: int = 0
    charged: int = 0  # tokens added to the minute for this request: the reservation, and any excess

    def __post_init__(self) -> None:
        self.charged = self.reservation.tokens if self.reservation is not None else 0

    def reserved(self, reservation: TokenReservation | None) -> None:
        """The reservation was raised (TenantLimiter.reserve_more) by its difference."""
        before = self.reservation.tokens if self.reservation is not None else 0
        after = reservation.tokens if reservation is not None else 0
        self.charged += max(0, after - before)
        self.reservation = reservation

    def report(self, tokens: int) -> int:
        """Record tokens the request used; returns how many to charge now (its use beyond `charged`)."""
        self.used += max(0, tokens)
        excess = max(0, self.used - self.charged)
        self.charged += excess
        return excess

    def closing(self) -> tuple[TokenReservation | None, int]:
        """What to settle when the request ends: (everything charged, as a reservation; tokens used)."""
        if self.reservation is None:
            return None, self.used
        return TokenReservation(self.reservation.minute, self.charged), self.used


@dataclass(frozen=True)
class Admission:
    decision: LimitDecision
    reservation: TokenReservation | None = None  # set when decision.allowed

    @property
    def allowed(self) -> bool:
        return self.decision.allowed


CHARS_PER_TOKEN = 4  # English text in a WordPiece/BPE vocabulary: the usual rule of thumb


def estimate_text_tokens(texts: list[str], per_text_cap: int | None = None, overhead: int = 2) -> int:
    """Tokens a list of texts is expected to cost before it is tokenized: characters / 4 per text
    (rounded up) plus its special tokens, each cut at what the model reads when that is known."""
    total = 0
    for text in texts:
        tokens = math.ceil(len(text) / CHARS_PER_TOKEN) + overhead
        total += min(tokens, per_text_cap) if per_text_cap else tokens
    return total


def estimate_ingest_tokens(texts: list[str], chunk_tokens: int, chunk_overlap: int) -> int:
    """An ingest's embedding tokens: its text at characters / 4, read again where chunks overlap."""
    body = estimate_text_tokens(texts, overhead=0)
    stride = max(1, chunk_tokens - chunk_overlap)
    return math.ceil(body * chunk_tokens / stride)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


class TenantLimiter(LockedSQLite):
    def __init__(self, db_path: str | Path, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        # One connection shared by this process's threads under a lock; we issue BEGIN ourselves.
        # Counters and leases need no fsync per commit: a power loss forgives a few requests at most.
        self._conn = connect(db_path, synchronous="NORMAL")
        with self._lock:
            self._conn.executescript(_SCHEMA)

    @staticmethod
    def _outstanding(conn: sqlite3.Connection, tenant: Tenant, minute: int) -> int:
        """Tokens charged to the tenant from `minute` on: the minute's own (at most the TPM) and the carry.
        Each minute since the last write took one TPM of what was charged then."""
        row = conn.execute(
            "SELECT minute, tokens FROM tpm_minutes WHERE tenant = ? AND minute <= ? ORDER BY minute DESC LIMIT 1",
            (tenant.name, minute),
        ).fetchone()
        if row is None:
            return 0
        written_at, tokens = row
        return max(0, tokens - (tenant.tpm or 0) * (minute - written_at))

    def _add_tokens(self, conn: sqlite3.Connection, tenant: Tenant, minute: int, delta: int) -> None:
        """Charge (or, negative, refund) tokens from `minute` on; the count never drops below 0, and what
        the minute cannot hold is carried, never charged to it."""
        outstanding = max(0, self._outstanding(conn, tenant, minute) + delta)
        conn.execute("DELETE FROM tpm_minutes WHERE tenant = ? AND minute < ?", (tenant.name, minute))
        conn.execute(
            "INSERT INTO tpm_minutes (tenant, minute, tokens) VALUES (?, ?, ?) "
            "ON CONFLICT (tenant, minute) DO UPDATE SET tokens = excluded.tokens",
            (tenant.name, minute, outstanding),
        )

    def _tpm_refusal(
        self, conn: sqlite3.Connection, tenant: Tenant, now: float, needed: int, estimate: int
    ) -> LimitDecision | None:
        """Why `needed` more tokens cannot be charged in this minute (the request's whole `estimate` over the
        TPM, or the minute without room for them), or None. The wait counts the carried minutes too."""
        tpm = tenant.tpm
        if estimate > tpm:
            return LimitDecision.too_large(tpm, estimate)
        minute = math.floor(now / WINDOW_SECONDS)
        outstanding = self._outstanding(conn, tenant, minute)
        if outstanding + needed <= tpm:
            return None
        minutes = math.ceil((outstanding + needed - tpm) / tpm)  # until enough of the charge has passed
        return LimitDecision.reject(
            "tpm", (minute + minutes) * WINDOW_SECONDS - now, limit=tpm, requested=estimate, used=min(outstanding, tpm)
        )

    # ---- rate limits ---------------------------------------------------------

    def admit(self, tenant: Tenant, estimated_tokens: int = 0, reserve: bool = True) -> Admission:
        """Admit or refuse one request; when admitted, count one RPM hit and reserve tokens.

        ``estimated_tokens`` is prompt tokens + max_tokens when known; at least 1 is reserved,
        so a tenant whose minute is spent is refused even without an estimate, and an estimate above
        the whole TPM is refused as request_too_large. Both limits are tested before anything is
        written, so a request refused for TPM uses no RPM slot.
        With ``reserve=False`` the minute must still have a token left, but none is held: the request
        reserves its own estimate later (reserve_more), and parallel admissions holding a token each
        cannot keep an estimate of the whole TPM out of an otherwise unused minute.
        """
        now = self._clock()
        if _unlimited(tenant):
            return _free_admission(now)
        with self._transaction() as conn:
            return self._admit_in(conn, tenant, now, estimated_tokens, reserve)

    def _admit_in(
        self, conn: sqlite3.Connection, tenant: Tenant, now: float, estimated_tokens: int, reserve: bool
    ) -> Admission:
        """admit's tests and writes, inside the caller's transaction."""
        minute = math.floor(now / WINDOW_SECONDS)
        needed = 0 if tenant.tpm is None else max(estimated_tokens, 1)
        reserve = needed if reserve else 0
        if tenant.tpm is not None:
            refused = self._tpm_refusal(conn, tenant, now, needed, needed)
            if refused is not None:  # without a reservation the estimate is not known yet: no "Requested"
                return Admission(refused if reserve else replace(refused, requested=None))
        if tenant.rpm is not None:
            conn.execute("DELETE FROM rpm_hits WHERE tenant = ? AND ts <= ?", (tenant.name, now - WINDOW_SECONDS))
            hits, oldest = conn.execute(
                "SELECT count(*), min(ts) FROM rpm_hits WHERE tenant = ?", (tenant.name,)
            ).fetchone()
            if hits >= tenant.rpm:
                # The next slot frees when the oldest hit leaves the window.
                return Admission(LimitDecision.reject("rpm", oldest + WINDOW_SECONDS - now))
            conn.execute("INSERT INTO rpm_hits (tenant, ts) VALUES (?, ?)", (tenant.name, now))
        if reserve:
            self._add_tokens(conn, tenant, minute, reserve)
        return Admission(LimitDecision.allow(), TokenReservation(minute, reserve))

    def acquire_and_admit(
        self, tenant: Tenant, estimated_tokens: int = 1, reserve: bool = False
    ) -> tuple[LimitDecision, TokenReservation | None]:
        """try_acquire and admit in one transaction (one write lock and one commit per request instead
        of two): the lease's decision and the reservation, or the first refusal (nothing written then)."""
        now = self._clock()
        with self._transaction() as conn:
            refused = self._concurrency_refusal(conn, tenant)
            if refused is not None:
                return refused, None
            admission = (
                _free_admission(now)
                if _unlimited(tenant)
                else self._admit_in(conn, tenant, now, estimated_tokens, reserve)
            )
            if not admission.allowed:
                return admission.decision, None
            return LimitDecision.allow(self._insert_lease(conn, tenant)), admission.reservation

    def settle_and_release(
        self, tenant: Tenant, reservation: TokenReservation | None, actual_tokens: int, lease_id: str | None
    ) -> None:
        """settle and release in one transaction: a request's close."""
        delta, minute = self._settlement(tenant, reservation, actual_tokens)
        if not delta and lease_id is None:
            return
        with self._transaction() as conn:
            if delta:
                self._add_tokens(conn, tenant, minute, delta)
            if lease_id is not None:
                conn.execute("DELETE FROM leases WHERE tenant = ? AND lease_id = ?", (tenant.name, lease_id))

    def reserve_more(self, tenant: Tenant, reservation: TokenReservation | None, estimated_tokens: int) -> Admission:
        """Raise an admitted request's reservation to its real estimate (prompt + max_tokens x n),
        known only once the body is read. Refused: the old reservation stands and nothing is written.
        An estimate above the whole TPM is refused as request_too_large: no minute could hold it."""
        now = self._clock()
        minute = math.floor(now / WINDOW_SECONDS)
        if tenant.tpm is None:
            return Admission(LimitDecision.allow(), reservation)
        wanted = max(estimated_tokens, 1)
        if wanted > tenant.tpm:  # decided without the database: nothing is read or written for it
            return Admission(LimitDecision.too_large(tenant.tpm, wanted), reservation)
        held = reservation.tokens if reservation is not None and reservation.minute == minute else 0
        extra = wanted - held
        if extra <= 0:
            return Admission(LimitDecision.allow(), reservation)
        with self._transaction() as conn:
            refused = self._tpm_refusal(conn, tenant, now, extra, wanted)
            if refused is not None:
                return Admission(refused, reservation)
            self._add_tokens(conn, tenant, minute, extra)
        return Admission(LimitDecision.allow(), TokenReservation(minute, wanted))

    def settle(self, tenant: Tenant, reservation: TokenReservation | None, actual_tokens: int) -> None:
        """Correct a reservation to the tokens the request really used.

        Within the reserved minute the difference (possibly negative; the count never drops
        below 0) is applied to that minute. Once that minute has ended a refund is pointless
        and is dropped, while an excess is charged to the current minute so it is not lost
        (what the minute cannot hold is carried to the next ones).
        """
        delta, minute = self._settlement(tenant, reservation, actual_tokens)
        if delta:
            with self._transaction() as conn:
                self._add_tokens(conn, tenant, minute, delta)

    def _settlement(self, tenant: Tenant, reservation: TokenReservation | None, actual_tokens: int) -> tuple[int, int]:
        """(tokens to add, minute) that settle a reservation; (0, minute) when nothing is to be written."""
        minute = math.floor(self._clock() / WINDOW_SECONDS)
        if tenant.tpm is None or reservation is None:
            return 0, minute
        delta = max(actual_tokens, 0) - reservation.tokens
        if delta < 0 and reservation.minute != minute:
            return 0, minute
        return delta, minute

    def charge_tokens(self, tenant: Tenant, tokens: int) -> None:
        """Charge tokens with no reservation (work whose count is only known afterwards). What the
        minute cannot hold is carried to the next minutes (at most the TPM each), so later requests
        wait for it and no minute is charged more than the TPM."""
        if tenant.tpm is None or tokens <= 0:
            return
        minute = math.floor(self._clock() / WINDOW_SECONDS)
        with self._transaction() as conn:
            self._add_tokens(conn, tenant, minute, tokens)

    def tokens_remaining(self, tenant: Tenant) -> int | None:
        """Tokens left in the current TPM minute; None when unlimited."""
        if tenant.tpm is None:
            return None
        minute = math.floor(self._clock() / WINDOW_SECONDS)
        with self._lock:
            return max(0, tenant.tpm - self._outstanding(self._conn, tenant, minute))

    def tokens_charged(self, tenant: Tenant) -> tuple[int, int]:
        """(tokens charged to the current minute, at most the TPM; tokens carried to the minutes after it).
        (0, 0) when unlimited."""
        if tenant.tpm is None:
            return 0, 0
        minute = math.floor(self._clock() / WINDOW_SECONDS)
        with self._lock:
            outstanding = self._outstanding(self._conn, tenant, minute)
        return min(outstanding, tenant.tpm), max(0, outstanding - tenant.tpm)

    # ---- concurrency ---------------------------------------------------------

    def try_acquire(self, tenant: Tenant) -> LimitDecision:
        """Take an in-flight slot; when allowed, pass ``decision.lease_id`` to ``release`` once."""
        with self._transaction() as conn:
            refused = self._concurrency_refusal(conn, tenant)
            return refused if refused is not None else LimitDecision.allow(self._insert_lease(conn, tenant))

    def _concurrency_refusal(self, conn: sqlite3.Connection, tenant: Tenant) -> LimitDecision | None:
        """Inside the caller's transaction: reclaim dead gateways' leases, then refuse if the tenant holds
        max_concurrency already."""
        pids = [
            row[0] for row in conn.execute("SELECT DISTINCT holder_pid FROM leases WHERE tenant = ?", (tenant.name,))
        ]
        for pid in pids:
            if not _pid_alive(pid):  # its gateway died without releasing
                conn.execute("DELETE FROM leases WHERE tenant = ? AND holder_pid = ?", (tenant.name, pid))
        if tenant.max_concurrency is not None:
            (held,) = conn.execute("SELECT count(*) FROM leases WHERE tenant = ?", (tenant.name,)).fetchone()
            if held >= tenant.max_concurrency:
                return LimitDecision.reject("concurrency", CONCURRENCY_RETRY_AFTER_SECONDS)
        return None

    def _insert_lease(self, conn: sqlite3.Connection, tenant: Tenant) -> str:
        lease_id = uuid.uuid4().hex
        conn.execute(
            "INSERT INTO leases (lease_id, tenant, holder_pid, created_at) VALUES (?, ?, ?, ?)",
            (lease_id, tenant.name, os.getpid(), self._clock()),
        )
        return lease_id

    def release(self, tenant: Tenant, lease_id: str | None) -> None:
        """Free exactly this lease; releasing it again (or None) does nothing."""
        if lease_id is None:
            return
        with self._transaction() as conn:
            conn.execute("DELETE FROM leases WHERE tenant = ? AND lease_id = ?", (tenant.name, lease_id))

    def in_flight(self, tenant_name: str) -> int:
        with self._lock:
            return self._conn.execute("SELECT count(*) FROM leases WHERE tenant = ?", (tenant_name,)).fetchone()[0]

    def is_heaviest(self, tenant_name: str, at_least: int) -> bool:
        """Whether this tenant holds the most leases (requests in flight, every gateway replica), at least
        `at_least` of them and more than any other tenant: the one whose work grows the pool most."""
        with self._lock:
            top = self._conn.execute(
                "SELECT tenant, count(*) AS n FROM leases GROUP BY tenant ORDER BY n DESC LIMIT 2"
            ).fetchall()
        if not top or top[0][0] != tenant_name or top[0][1] < at_least:
            return False
        return len(top) == 1 or top[0][1] > top[1][1]

    def forget(self, tenant_name: str) -> None:
        """Delete every row of a tenant (e.g. once it is deleted)."""
        with self._transaction() as conn:
            for table in ("rpm_hits", "tpm_minutes", "leases"):
                conn.execute(f"DELETE FROM {table} WHERE tenant = ?", (tenant_name,))


def _unlimited(tenant: Tenant) -> bool:
    return tenant.rpm is None and tenant.tpm is None


def _free_admission(now: float) -> Admission:
    """An admission that counts nothing: the tenant has neither an RPM nor a TPM limit."""
    return Admission(LimitDecision.allow(), TokenReservation(math.floor(now / WINDOW_SECONDS), 0))
