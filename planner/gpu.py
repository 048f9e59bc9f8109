"""GPU shares Ray will grant: a replica's `num_gpus` from its planned share of the pool.

On a unified-memory GPU (DGX Spark) `num_gpus` limits no memory: vLLM's is set by
gpu_memory_utilization, the embedder's by its planned bytes. It is a scheduling share, and the shares of
everything on the one GPU must sum to <= 1 or Ray never places the last replica ("no GPU available").
Deriving each from planned bytes keeps the sum at most (planned bytes on the GPU) / pool <= 1, which
build_plan already enforces by refusing overcommit.
"""

from __future__ import annotations


# Ray subdivides one resource into 10,000 units (ray/_private/ray_constants.py MIN_RESOURCE_GRANULARITY);
# a finer fraction is rounded by Ray, possibly up, so shares are rounded down to whole units here.
GPU_UNITS = 10_000


def gpu_fraction(planned_bytes: int, pool_bytes: int) -> float:
    """One copy's `num_gpus`: planned_bytes / pool_bytes rounded down to Ray's unit. Rounding down keeps any
    set of replicas whose planned bytes fit the pool at a sum <= 1 (a sum of floors never exceeds the floor
    of the sum). A share below one unit cannot be granted as a GPU share at all, so it is refused; one above
    the pool is capped at the whole GPU (build_plan refuses that plan as overcommitted, with its advice)."""
    if pool_bytes <= 0 or planned_bytes <= 0:
        raise ValueError(f"a GPU share needs positive planned bytes ({planned_bytes}) and pool ({pool_bytes})")
    units = min(GPU_UNITS, planned_bytes * GPU_UNITS // pool_bytes)
    if units < 1:
        raise ValueError(f"{planned_bytes} B is below Ray's smallest GPU share (1/{GPU_UNITS:,} of {pool_bytes} B)")
    return units / GPU_UNITS


def torch_device(num_gpus: float | None) -> str:
    """The device a replica's torch model runs on: `cuda` when its plan gives it a GPU share, else `cpu`."""
    return "cuda" if num_gpus else "cpu"
