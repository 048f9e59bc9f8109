"""GPU shares from the plan: each replica's `num_gpus` is its planned share of the pool in Ray's units."""

from __future__ import annotations

import random

import pytest

from planner.gpu import GPU_UNITS, gpu_fraction, torch_device
from planner.units import GiB


def _units(share: float) -> int:
    """A share in Ray's units: what Ray sums (ray/_private/ray_constants.py MIN_RESOURCE_GRANULARITY)."""
    units = round(share * GPU_UNITS)
    assert units == pytest.approx(share * GPU_UNITS, abs=1e-6), f"{share} is finer than Ray's unit"
    return units


def test_fraction_is_the_planned_share_rounded_down_to_rays_unit():
    assert gpu_fraction(1, 4) == 0.25
    assert gpu_fraction(2, 3) == 0.6666  # down, not 0.6667: a third replica of 1/3 still fits
    assert gpu_fraction(1, 3) + gpu_fraction(1, 3) + gpu_fraction(1, 3) <= 1
    assert gpu_fraction(120 * GiB, 120 * GiB) == 1.0
    assert gpu_fraction(3 * GiB, 2 * GiB) == 1.0  # overcommit is build_plan's to refuse; the share is capped
    assert gpu_fraction(10_000, 10_000 * 10_000) == 0.0001
    with pytest.raises(ValueError, match="smallest GPU share"):
        gpu_fraction(9_999, 10_000 * 10_000)
    for bad in ((0, 10), (-1, 10), (5, 0)):
        with pytest.raises(ValueError):
            gpu_fraction(*bad)


def test_fractions_of_any_split_of_the_pool_sum_to_at_most_one():
    rng = random.Random(15)
    for _ in range(2000):
        pool = rng.randrange(10**6, 200 * GiB)
        cuts = sorted(rng.randrange(pool // 100, pool) for _ in range(rng.randrange(1, 6)))
        parts = [b - a for a, b in zip([0, *cuts], cuts) if b - a >= pool // GPU_UNITS + 1]
        assert sum(_units(gpu_fraction(p, pool)) for p in parts) <= GPU_UNITS


def test_device_follows_the_plans_gpu_share():
    assert torch_device({"num_cpus": 2, "num_gpus": 0.0172}) == "cuda"
    assert torch_device({"num_cpus": 2}) == "cpu"
    assert torch_device({"num_cpus": 2, "num_gpus": 0.0}) == "cpu"
