"""Cost of the shared tenant limiter (tenancy/limits.py, one SQLite file for all gateway replicas)
against the in-process limiter it replaced (`limits`' MemoryStorage), side by side.

    .venv/bin/python bench/bench_limits.py [--rounds 2000]

Times, per request: the shared path (lease + admission + settlement + release) and the old
in-memory path (concurrency counter + moving-window RPM hit + fixed-window TPM charge).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from limits import RateLimitItemPerMinute
from limits.storage import MemoryStorage
from limits.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter

from tenancy.limits import TenantLimiter
from tenancy.models import Tenant


def _timed(step, rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        step()
        samples.append((time.perf_counter() - started) * 1e6)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    tenant = Tenant(name="bench", models=None, rpm=10**9, tpm=10**12, max_concurrency=10**6)
    with tempfile.TemporaryDirectory() as tmp, TenantLimiter(Path(tmp) / "limits.sqlite3") as limiter:
        def shared():
            lease = limiter.try_acquire(tenant)
            admission = limiter.admit(tenant, estimated_tokens=300)
            limiter.settle(tenant, admission.reservation, 250)
            limiter.release(tenant, lease.lease_id)

        shared_us = _timed(shared, args.rounds)
    storage = MemoryStorage()
    rpm, tpm = MovingWindowRateLimiter(storage), FixedWindowRateLimiter(storage)
    rpm_item, tpm_item = RateLimitItemPerMinute(10**9, namespace="r"), RateLimitItemPerMinute(10**12, namespace="t")
    in_flight = {}

    def in_memory():
        in_flight["bench"] = in_flight.get("bench", 0) + 1
        rpm.hit(rpm_item, "bench")
        tpm.hit(tpm_item, "bench", cost=250)
        in_flight["bench"] -= 1

    memory_us = _timed(in_memory, args.rounds)
    for name, samples in (("shared SQLite limiter", shared_us), ("in-process limits (old)", memory_us)):
        print(f"{name:26s} median {statistics.median(samples):7.1f} us  p99 "
              f"{sorted(samples)[int(len(samples) * 0.99)]:8.1f} us")
    print(f"ratio (shared / old): {statistics.median(shared_us) / statistics.median(memory_us):.1f}x")


if __name__ == "__main__":
    main()
