"""Pure figures for the stress layers: layer selection, percentiles, memory drift, sustained clock drops."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

LAYER_NAMES = {
    1: "single-request stability",
    2: "long context",
    3: "high concurrency",
    4: "mixed lengths",
    5: "crash recovery",
    6: "thermal throttling",
    7: "upgrade compatibility",
}


def parse_layers(text: str) -> list[int]:
    """'1-7', '1,3,5', '2-4,7' -> sorted layer numbers; anything else is a ValueError naming the problem."""
    chosen: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        if not part:
            raise ValueError(f"--layers {text!r}: empty item; use e.g. 1-7 or 1,3,5")
        bounds = part.split("-")
        if len(bounds) > 2 or not all(b.strip().isdigit() for b in bounds):
            raise ValueError(f"--layers {text!r}: cannot read {part!r}; use e.g. 1-7 or 1,3,5")
        low, high = int(bounds[0]), int(bounds[-1])
        if low > high:
            raise ValueError(f"--layers {text!r}: {part!r} runs backwards")
        for layer in range(low, high + 1):
            if layer not in LAYER_NAMES:
                raise ValueError(f"--layers {text!r}: there is no layer {layer}; the layers are 1-7")
            chosen.add(layer)
    return sorted(chosen)


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Linear-interpolated percentile (fraction 0..1); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * fraction
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def latency_summary(values: Sequence[float]) -> dict:
    """Count, mean, standard deviation, p50/p95/p99, min and max in seconds (rounded to the millisecond)."""
    if not values:
        return {"count": 0}
    summary = {
        "count": len(values),
        "mean_s": statistics.fmean(values),
        "stdev_s": statistics.stdev(values) if len(values) > 1 else 0.0,
        "p50_s": percentile(values, 0.50),
        "p95_s": percentile(values, 0.95),
        "p99_s": percentile(values, 0.99),
        "min_s": min(values),
        "max_s": max(values),
    }
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in summary.items()}


@dataclass(frozen=True)
class Drift:
    replica: str
    baseline_bytes: int
    end_bytes: int
    allowed_bytes: int

    @property
    def growth_bytes(self) -> int:
        return self.end_bytes - self.baseline_bytes

    @property
    def ok(self) -> bool:
        return self.growth_bytes <= self.allowed_bytes

    def as_dict(self) -> dict:
        return {
            "replica": self.replica,
            "baseline_mib": round(self.baseline_bytes / 2**20, 1),
            "end_mib": round(self.end_bytes / 2**20, 1),
            "growth_mib": round(self.growth_bytes / 2**20, 1),
            "growth_pct": round(100 * self.growth_bytes / self.baseline_bytes, 2) if self.baseline_bytes else None,
            "allowed_mib": round(self.allowed_bytes / 2**20, 1),
            "ok": self.ok,
        }


def memory_drift(
    samples: Sequence[dict[str, int]],
    fraction: float,
    floor_bytes: int,
    window: int = 3,
    planned_growth: Mapping[str, int] | None = None,
) -> list[Drift]:
    """Growth of each replica's memory from the start to the end of a series of /status samples.

    Baseline and end are medians of the first and last `window` samples, so one sample taken while a
    batch is in flight does not decide the verdict. Allowed growth: what the plan lets the replica grow
    by (planned_growth: budget minus at-rest bytes) when it says more than nothing; else fraction of the
    baseline or floor_bytes, whichever is larger. A replica missing from some samples (restarting) uses
    the samples it has; one seen in fewer than 2 samples is left out."""
    names = sorted({name for sample in samples for name in sample})
    drifts = []
    for name in names:
        series = [sample[name] for sample in samples if name in sample]
        if len(series) < 2:
            continue
        size = max(1, min(window, len(series) // 2))
        baseline = int(statistics.median(series[:size]))
        end = int(statistics.median(series[-size:]))
        planned = (planned_growth or {}).get(name)
        allowed = planned if planned else max(int(baseline * fraction), int(floor_bytes))
        drifts.append(Drift(name, baseline, end, allowed))
    return drifts


def sustained_drop(
    samples: Sequence[tuple[float, float]], fraction: float, seconds: float, reference_count: int = 3
) -> dict:
    """The longest run of (time, clock) samples below (1 - fraction) x the median of the first samples.

    Returns the reference, the lowest value, the longest drop in seconds and whether it lasted at least
    `seconds` (a sustained drop)."""
    if len(samples) < reference_count + 1:
        return {"reference": None, "lowest": None, "longest_drop_s": 0.0, "sustained": False}
    reference = statistics.median(value for _, value in samples[:reference_count])
    limit = reference * (1 - fraction)
    longest, started = 0.0, None
    for t, value in samples:
        if value < limit:
            started = t if started is None else started
            longest = max(longest, t - started)
        else:
            started = None
    return {
        "reference": reference,
        "lowest": min(v for _, v in samples),
        "longest_drop_s": round(longest, 1),
        "sustained": longest >= seconds,
    }
