"""How the embedder replica shares its process and the machine between callers.

- BatchTurns: one forward pass at a time (the plan budgets one batch's activations); a waiting
  question goes before waiting document batches, so a query waits for at most one batch of an
  ingest instead of the whole ingest call (half a batch while questions keep coming: the embedder
  halves its document batches then, deployments/embedder.py); and tenants' document batches take turns, so
  one tenant's bulk ingest cannot starve another's embeddings or ingest.
- OneForwardThread: every forward pass on one thread. Serve runs each call in a thread of its pool, and
  each thread that runs torch gets an OpenMP team and a glibc arena of its own, which stay (measured:
  the replica 87 MB over its plan after a bulk ingest beside another tenant's embeddings).
- IdleCores + threads_for: a document batch may borrow the cores the rest of the machine left idle
  since the last batch (the chat engine between requests), and falls back to the planned
  torch_threads when they are busy, so an ingest on an idle stack runs at the encoder's full speed
  without taking the engine's planned core while it generates.
- WhenIdle: a clean-up that runs once no call has been in flight for a while, instead of after each call.
"""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import psutil

# Busy cores below this fraction of a core are background noise (Ray's own processes, the gateway's
# health checks): an idle stack still counts as idle.
ROUNDING = 0.5
# Tenants whose last turn BatchTurns remembers; forgetting one only moves it to the front of the line once.
MAX_TENANTS_REMEMBERED = 4096


class BatchTurns:
    """Who runs the next forward pass: a waiting question before any document batch, then the tenant whose
    last batch ran longest ago (so each tenant with work waiting gets every other turn, however many calls
    it sends at once), then the caller that asked first. Each waiter holds a ticket; the one whose ticket
    ranks first takes the turn, so a caller that just let go cannot barge back in ahead of another tenant."""

    def __init__(self):
        self._changed = threading.Condition()
        self._busy = False
        self._waiting: dict[int, tuple[bool, str]] = {}  # ticket -> (question, tenant)
        self._tickets = itertools.count()
        self._served = itertools.count(1)
        self._last_served: dict[str, int] = {}  # tenant -> the turn it last had (0: never)
        self._last_question_at = float("-inf")

    @property
    def questions_waiting(self) -> int:
        with self._changed:
            return sum(question for question, _ in self._waiting.values())

    def question_within(self, seconds: float, now: float | None = None) -> bool:
        """Whether a question asked for a turn in the last `seconds`."""
        with self._changed:
            return (time.monotonic() if now is None else now) - self._last_question_at <= seconds

    def _rank(self, ticket: int) -> tuple[bool, int, int]:
        question, tenant = self._waiting[ticket]
        return (not question, self._last_served.get(tenant, 0), ticket)

    def _first(self) -> int:
        return min(self._waiting, key=self._rank)

    @contextmanager
    def turn(self, question: bool, tenant: str = "") -> Iterator[None]:
        with self._changed:
            ticket = next(self._tickets)
            self._waiting[ticket] = (question, tenant)
            if question:
                self._last_question_at = time.monotonic()
            try:
                self._changed.wait_for(lambda: not self._busy and self._first() == ticket)
            finally:
                del self._waiting[ticket]
                self._changed.notify_all()  # a waiter that gave up may have been the first
            self._busy = True
            self._last_served[tenant] = next(self._served)
            if len(self._last_served) > MAX_TENANTS_REMEMBERED:  # the oldest memories matter least
                for old in sorted(self._last_served, key=self._last_served.get)[: len(self._last_served) // 2]:
                    del self._last_served[old]
        try:
            yield
        finally:
            with self._changed:
                self._busy = False
                self._changed.notify_all()


def _set_torch_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)  # per thread in torch: called on the thread that runs the passes


class OneForwardThread:
    """Runs every forward pass on one thread of its own, with the thread count its batch was given."""

    def __init__(self, set_threads: Callable[[int], None] = _set_torch_threads):
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="embedder-forward")
        self._set_threads = set_threads
        self._threads: int | None = None  # only the forward thread reads or writes it

    def runner(self, threads: int) -> Callable[[Callable[[], Any]], Any]:
        def run(forward: Callable[[], Any]) -> Any:
            return self._executor.submit(self._run, threads, forward).result()

        return run

    def _run(self, threads: int, forward: Callable[[], Any]) -> Any:
        if threads != self._threads:
            self._set_threads(threads)
            self._threads = threads
        return forward()


def threads_for(idle_cores: float, least: int, most: int) -> int:
    """Threads for the next batch: the cores nobody else used, within [least, most]."""
    return max(least, min(most, int(idle_cores + ROUNDING)))


def _machine_busy_seconds() -> float:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0)


def _own_busy_seconds() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


class IdleCores:
    """Cores left idle by everything but this process since the previous call (this process's own use
    counts as idle: its threads are the ones being decided)."""

    def __init__(
        self,
        cpus: int,
        clock: Callable[[], float] = time.monotonic,
        machine_busy: Callable[[], float] = _machine_busy_seconds,
        own_busy: Callable[[], float] = _own_busy_seconds,
    ):
        self._cpus, self._clock, self._machine, self._own = cpus, clock, machine_busy, own_busy
        self._last = self._sample()
        self._idle = float(cpus)

    def _sample(self) -> tuple[float, float, float]:
        return self._clock(), self._machine(), self._own()

    def __call__(self) -> float:
        now = self._sample()
        elapsed = now[0] - self._last[0]
        if elapsed >= 0.05:  # too short an interval says nothing: keep the last answer
            others = max(0.0, (now[1] - self._last[1]) - (now[2] - self._last[2])) / elapsed
            self._idle = max(0.0, self._cpus - others)
            self._last = now
        return self._idle


class WhenIdle:
    """Runs `cleanup` once no call has been in flight for `settle_s`: a run of calls (an ingest's embed calls)
    pays for it once, after the last, instead of once each. A call that starts cancels a pending run."""

    def __init__(self, cleanup: Callable[[], None], settle_s: float, timer: Callable[..., Any] = threading.Timer):
        self._cleanup, self._settle_s, self._timer = cleanup, settle_s, timer
        self._lock = threading.Lock()
        self._in_flight = 0
        self._calls = 0  # calls started so far: a timer set before the latest one is stale
        self._pending: Any = None

    @contextmanager
    def call(self) -> Iterator[None]:
        with self._lock:
            self._in_flight += 1
            self._calls += 1
            if self._pending is not None:
                self._pending.cancel()
                self._pending = None
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._pending = self._timer(self._settle_s, self._fire, args=(self._calls,))
                    self._pending.daemon = True
                    self._pending.start()

    def _fire(self, calls: int) -> None:
        with self._lock:
            if self._in_flight or calls != self._calls:
                return
            self._pending = None
        self._cleanup()
