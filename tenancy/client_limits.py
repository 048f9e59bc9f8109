"""Per-client-address limits for traffic that carries no valid key: requests in flight, requests per
moving minute, and wrong admin keys at the dashboard login form.

In process memory, per gateway replica: these guard the replica itself (its event loop, its
threads), which a shared SQLite file would not help with, and an attacker's requests must cost a
lookup in a dict, not a database write. The table is bounded (least recently seen forgotten first),
so a client with many addresses cannot grow it without end.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

WINDOW_SECONDS = 60.0
# A client over its in-flight cap has no window to wait for; ask for a short retry.
BUSY_RETRY_AFTER_SECONDS = 1


@dataclass(frozen=True)
class ClientRefusal:
    """Why a client's request is refused (for a 429), and when to come back."""

    message: str
    retry_after_seconds: int


@dataclass
class _Client:
    in_flight: int = 0
    hits: deque = field(default_factory=deque)  # admission times inside the window
    failures: deque = field(default_factory=deque)  # wrong login keys inside the window


def _retry_after(oldest: float, now: float) -> int:
    return max(1, math.ceil(oldest + WINDOW_SECONDS - now))


class ClientLimiter:
    """Thread-safe; one per gateway replica. `enter` before serving an unauthenticated request and
    `leave` once it is answered; `note_failed_login` / `login_refusal` for the login form."""

    def __init__(
        self,
        max_concurrent: int,
        per_minute: int,
        login_failures_per_minute: int,
        tracked_clients: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_concurrent = max_concurrent
        self.per_minute = per_minute
        self.login_failures_per_minute = login_failures_per_minute
        self.tracked_clients = tracked_clients
        self._clock = clock
        self._clients: OrderedDict[str, _Client] = OrderedDict()
        self._lock = threading.Lock()

    def _client(self, address: str) -> _Client:
        client = self._clients.get(address)
        if client is None:
            client = self._clients[address] = _Client()
            self._forget_beyond_capacity()
        self._clients.move_to_end(address)
        return client

    def _forget_beyond_capacity(self) -> None:
        """Drop the least recently seen clients with nothing in flight (their windows are lost, which
        only ever favours them; a client's own requests in flight are never forgotten)."""
        for address in list(self._clients):
            if len(self._clients) <= self.tracked_clients:
                return
            if self._clients[address].in_flight == 0:
                del self._clients[address]

    @staticmethod
    def _expire(times: deque, now: float) -> None:
        while times and times[0] <= now - WINDOW_SECONDS:
            times.popleft()

    def enter(self, address: str) -> ClientRefusal | None:
        """Admit one request (count it in flight and in the minute), or say why not."""
        now = self._clock()
        with self._lock:
            client = self._client(address)
            if client.in_flight >= self.max_concurrent:
                return ClientRefusal(
                    f"client {address} has {client.in_flight} requests without a valid key in "
                    f"flight; the limit is {self.max_concurrent} (gateway.client_max_concurrent)",
                    BUSY_RETRY_AFTER_SECONDS,
                )
            if (refusal := self._over_rate(address, client, now)) is not None:
                return refusal
            client.hits.append(now)
            client.in_flight += 1
        return None

    def _over_rate(self, address: str, client: _Client, now: float) -> ClientRefusal | None:
        self._expire(client.hits, now)
        if len(client.hits) < self.per_minute:
            return None
        return ClientRefusal(
            f"client {address} sent {len(client.hits)} requests without a valid key in the last "
            f"minute; the limit is {self.per_minute} (gateway.client_requests_per_minute)",
            _retry_after(client.hits[0], now),
        )

    def leave(self, address: str) -> None:
        with self._lock:
            client = self._clients.get(address)
            if client is not None and client.in_flight > 0:
                client.in_flight -= 1

    def note_rejected_key(self, address: str) -> ClientRefusal | None:
        """A request whose key was wrong: counted in the client's minute; the refusal once it is over.
        (Never checked before a key is: a valid key is always let in, whoever shares its address.)"""
        now = self._clock()
        with self._lock:
            client = self._client(address)
            refusal = self._over_rate(address, client, now)
            if refusal is None:
                client.hits.append(now)
            return refusal

    def login_refusal(self, address: str) -> ClientRefusal | None:
        """Refuse the login form (before looking at the key) while the client is over its failures."""
        now = self._clock()
        with self._lock:
            client = self._client(address)
            self._expire(client.failures, now)
            if len(client.failures) < self.login_failures_per_minute:
                return None
            return ClientRefusal(
                f"{len(client.failures)} wrong admin keys from {address} in the last minute; the "
                f"limit is {self.login_failures_per_minute} (gateway.login_failures_per_minute)",
                _retry_after(client.failures[0], now),
            )

    def note_failed_login(self, address: str) -> None:
        now = self._clock()
        with self._lock:
            client = self._client(address)
            self._expire(client.failures, now)
            client.failures.append(now)

    def in_flight(self, address: str) -> int:
        with self._lock:
            client = self._clients.get(address)
            return client.in_flight if client else 0

    def tracked(self) -> int:
        with self._lock:
            return len(self._clients)
