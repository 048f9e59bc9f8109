"""Cost of the shared tenant limiter (tenancy/limits.py, one SQLite file for all gateway replicas)
against the in-process limiter it replaced (`limits`' MemoryStorage), side by side.

    .venv/bin/python bench/bench_limits.py [--rounds 2000]

Times, per request: the shared path as the gateway runs it now (lease and admission in one
transaction, settlement and release in another: acquire_and_admit, settle_and_release), the same four
steps as four transactions (the gateway before 2026-12-02), and the old in-memory path (concurrency
counter + moving-window RPM hit + fixed-window TPM charge).
Writes bench/results/limits.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.harness.results import RESULTS_DIR, BenchResult, new_result, write_result  # noqa: E402
from bench.harness.timing import percentile, time_repeated  # noqa: E402

NAME = "limits"
SHARED, SHARED_FOUR, IN_MEMORY = ("shared SQLite limiter", "shared, 4 transactions (before)", "in-process limits (old)")


def shared_limiter_seconds(rounds: int, transactions: int = 2) -> list[float]:
    from tenancy.limits import TenantLimiter
    from tenancy.models import Tenant

    # Limits that never bind, so every round takes every step (a TPM cap keeps the token writes in).
    tenant = Tenant(name="bench", models=None, rpm=10**9, tpm=10**12, max_concurrency=10**6)
    with tempfile.TemporaryDirectory() as tmp, TenantLimiter(Path(tmp) / "limits.sqlite3") as limiter:

        def two_transactions():
            lease, reservation = limiter.acquire_and_admit(tenant, estimated_tokens=300, reserve=True)
            limiter.settle_and_release(tenant, reservation, 250, lease.lease_id)

        def four_transactions():
            lease = limiter.try_acquire(tenant)
            admission = limiter.admit(tenant, estimated_tokens=300)
            limiter.settle(tenant, admission.reservation, 250)
            limiter.release(tenant, lease.lease_id)

        return time_repeated(two_transactions if transactions == 2 else four_transactions, rounds)


def in_memory_limiter_seconds(rounds: int) -> list[float]:
    from limits import RateLimitItemPerMinute
    from limits.storage import MemoryStorage
    from limits.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter

    storage = MemoryStorage()
    rpm, tpm = MovingWindowRateLimiter(storage), FixedWindowRateLimiter(storage)
    rpm_item, tpm_item = RateLimitItemPerMinute(10**9, namespace="r"), RateLimitItemPerMinute(10**12, namespace="t")
    in_flight = {"bench": 0}

    def one_request():
        in_flight["bench"] += 1
        rpm.hit(rpm_item, "bench")
        tpm.hit(tpm_item, "bench", cost=250)
        in_flight["bench"] -= 1

    return time_repeated(one_request, rounds)


def run(rounds: int) -> BenchResult:
    rows = []
    for path, seconds in (
        (SHARED, shared_limiter_seconds(rounds)),
        (SHARED_FOUR, shared_limiter_seconds(rounds, 4)),
        (IN_MEMORY, in_memory_limiter_seconds(rounds)),
    ):
        micros = [s * 1e6 for s in seconds]
        rows.append(
            {"path": path, "rounds": rounds, "median_us": percentile(micros, 50), "p99_us": percentile(micros, 99)}
        )
    by = {row["path"]: row["median_us"] for row in rows}
    return new_result(
        NAME,
        {"rounds": rounds},
        {
            "median_ratio_shared_vs_old": by[SHARED] / by[IN_MEMORY],
            "median_ratio_shared_vs_four": by[SHARED] / by[SHARED_FOUR],
        },
        rows,
    )


def tables(result: BenchResult) -> str:
    """Section 5's table: one row per run, each path's median and p99 per request."""
    by = {row["path"]: row for row in result.rows}
    cell = lambda row: f"median {row['median_us']:.1f} µs, p99 {row['p99_us']:.1f} µs"  # noqa: E731
    lines = [
        "| requests | shared SQLite limiter (2 transactions) | the same in 4 (before) | in-process (old) | "
        "vs 4 | vs in-process |",
        "|---:|---|---|---|---:|---:|",
    ]
    four = by.get(SHARED_FOUR)
    lines.append(
        f"| {result.config['rounds']} | {cell(by[SHARED])} | {cell(four) if four else 'n/a'} | "
        f"{cell(by[IN_MEMORY])} | {result.metrics.get('median_ratio_shared_vs_four', float('nan')):.2f}x | "
        f"{result.metrics['median_ratio_shared_vs_old']:.1f}x |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    result = run(args.rounds)
    print(tables(result))
    print(f"wrote {write_result(result, args.out_dir)}")


if __name__ == "__main__":
    main()
