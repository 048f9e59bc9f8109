"""How the embedder replica shares its process and the machine between callers.

- BatchTurns: one forward pass at a time (the plan budgets one batch's activations), and a waiting
  question goes before waiting document batches, so a query waits for at most one batch of an
  ingest instead of the whole ingest call.
- IdleCores + threads_for: a document batch may borrow the cores the rest of the machine left idle
  since the last batch (the chat engine between requests), and falls back to the planned
  torch_threads when they are busy, so an ingest on an idle stack runs at the encoder's full speed
  without taking the engine's planned core while it generates.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import psutil

# Busy cores below this fraction of a core are background noise (Ray's own processes, the gateway's
# health checks): an idle stack still counts as idle.
ROUNDING = 0.5


class BatchTurns:
    def __init__(self):
        self._changed = threading.Condition()
        self._busy = False
        self._questions_waiting = 0

    @contextmanager
    def turn(self, question: bool) -> Iterator[None]:
        with self._changed:
            self._questions_waiting += question
            try:
                self._changed.wait_for(lambda: not self._busy and (question or not self._questions_waiting))
            finally:
                self._questions_waiting -= question
            self._busy = True
        try:
            yield
        finally:
            with self._changed:
                self._busy = False
                self._changed.notify_all()


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

    def __init__(self, cpus: int, clock: Callable[[], float] = time.monotonic,
                 machine_busy: Callable[[], float] = _machine_busy_seconds,
                 own_busy: Callable[[], float] = _own_busy_seconds):
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
