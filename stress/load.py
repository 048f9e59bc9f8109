"""Concurrent clients and background samplers, all bounded in time and count."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from stress.client import Outcome
from stress.measure import latency_summary


def run_clients(
    clients: int,
    operation: Callable[[int, int], Outcome],
    seconds: float | None = None,
    total: int | None = None,
    stop: threading.Event | None = None,
) -> list[Outcome]:
    """`clients` threads call operation(client, n) until `seconds` have passed or `total` calls were made
    (whichever comes first; at least one of them bounds the run), or `stop` is set."""
    if seconds is None and total is None:
        raise ValueError("a load needs a duration or a request count")
    deadline = time.monotonic() + seconds if seconds is not None else None
    counter = itertools.count()
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        while (deadline is None or time.monotonic() < deadline) and not (stop and stop.is_set()):
            n = next(counter)
            if total is not None and n >= total:
                return
            outcome = operation(index, n)
            with lock:
                outcomes.append(outcome)

    with ThreadPoolExecutor(max_workers=clients, thread_name_prefix="stress-client") as pool:
        for future in [pool.submit(client, i) for i in range(clients)]:
            future.result()
    return outcomes


def summarize(outcomes: Sequence[Outcome]) -> dict:
    """Per route: counts by kind and the latency of the successful requests."""
    by_route: dict[str, list[Outcome]] = defaultdict(list)
    for outcome in outcomes:
        by_route[outcome.route].append(outcome)
    table = {}
    for route, items in sorted(by_route.items()):
        kinds = Counter(o.kind for o in items)
        table[route] = {
            "requests": len(items),
            "ok": kinds["ok"],
            "429/503": kinds["intended"],
            "errors": kinds["error"],
            "timeouts": kinds["timeout"],
            **latency_summary([o.seconds for o in items if o.kind == "ok"]),
        }
        table[route].pop("count", None)
    return table


def error_examples(outcomes: Sequence[Outcome], limit: int = 3) -> list[str]:
    return [f"{o.route} {o.status}: {o.detail[:120]}" for o in outcomes if o.kind in ("error", "timeout")][:limit]


class Sampler:
    """Calls `read()` every `interval_s` on a thread until stopped; keeps (monotonic time, value).
    A read that raises is recorded as a miss, not a crash."""

    def __init__(self, read: Callable[[], object], interval_s: float, max_samples: int = 10_000):
        self._read, self._interval, self._max = read, interval_s, max_samples
        self.samples: list[tuple[float, object]] = []
        self.misses: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="stress-sampler")

    def _loop(self) -> None:
        while not self._stop.is_set() and len(self.samples) < self._max:
            try:
                self.samples.append((time.monotonic(), self._read()))
            except Exception as exc:  # a sampler must never take the layer down
                self.misses.append(f"{type(exc).__name__}: {exc}"[:160])
            self._stop.wait(self._interval)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def values_since(self, start: float) -> list:
        return [value for t, value in self.samples if t >= start]
