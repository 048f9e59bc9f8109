"""Percentiles and timers, one definition for every benchmark.

Percentiles interpolate linearly between the two nearest ranks (numpy's default method), so a p99
here means the same thing in the limiter, retrieval and serving tables."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

DEFAULT_PERCENTILES = (50, 95, 99)


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0-100) of values, linear between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0-100")
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(values: Sequence[float], percentiles: Iterable[float] = DEFAULT_PERCENTILES) -> dict[str, float]:
    """n, mean, min, max and the given percentiles (keys p50, p95, ...; p99.9 stays 'p99.9')."""
    if not values:
        raise ValueError("summary of no values")
    summary = {"n": len(values), "mean": sum(values) / len(values), "min": min(values), "max": max(values)}
    for q in percentiles:
        summary[f"p{q:g}"] = percentile(values, q)
    return summary


class Stopwatch:
    """`with Stopwatch() as watch: ...` then watch.seconds (perf_counter, wall time)."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.seconds: float | None = None

    def __enter__(self) -> Stopwatch:
        self.started = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self.started


def time_each(fn: Callable[[Any], Any], inputs: Sequence[Any], warmup: int = 0) -> tuple[list[float], list[Any]]:
    """Seconds and result of fn(x) for every x of inputs, after fn on the first `warmup` inputs untimed."""
    for item in inputs[:warmup]:
        fn(item)
    seconds, results = [], []
    for item in inputs:
        started = time.perf_counter()
        results.append(fn(item))
        seconds.append(time.perf_counter() - started)
    return seconds, results


def time_repeated(fn: Callable[[], Any], rounds: int) -> list[float]:
    """Seconds of each of `rounds` calls of fn()."""
    seconds = []
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - started)
    return seconds


def best_of(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> tuple[float, Any]:
    """The fastest of `repeats` timed calls after `warmup` untimed ones, and the last call's result:
    the least disturbed run on a shared machine."""
    for _ in range(warmup):
        fn()
    best, result = math.inf, None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - started)
    return best, result
