"""GPU shares Ray will grant: a replica's `num_gpus` from its planned share of the pool.

On a unified-memory GPU (DGX Spark) `num_gpus` limits no memory: vLLM's is set by
gpu_memory_utilization, the embedder's by its planned bytes. It is a scheduling share, and the shares of
everything on the one GPU must sum to <= 1 or Ray never places the last replica ("no GPU available").
Deriving each from planned bytes keeps the sum at most (planned bytes on the GPU) / pool <= 1, which
build_plan already enforces by refusing overcommit.
"""

from __future__ import annotations

from planner.outputs import RayActorOptions


# Ray subdivides one resource into 10,000 units (ray/_private/ray_constants.py MIN_RESOURCE_GRANULARITY);
# a finer fraction is rounded by Ray, possibly up, so shares are rounded down to whole units here.
GPU_UNITS = 10_000
# A chat replica actor only relays requests; the engine's CPU share sits in its placement bundle.
REPLICA_ACTOR_CPUS = 0.05


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


def engine_placement(options: RayActorOptions) -> tuple[dict, dict]:
    """The replica actor's options and the engine's bundle, as ray.serve.llm 2.60 and vLLM 0.32 read them
    (site-packages paths under ray/llm/_internal/serve and vllm/):

    - core/server/llm_server.py get_deployment_options: the replica's num_cpus/num_gpus/memory are added to
      the engine's first bundle and the replica actor runs in bundle 0.
    - engines/vllm/vllm_models.py: a GPU key in a bundle makes the engine a GPU one, which forces
      distributed_executor_backend="ray" (CPU bundles: "mp"); the vLLM worker is then a Ray actor of its own.
    - vllm/v1/executor/ray_executor.py _init_workers_ray: that worker asks num_gpus=VLLM_RAY_PER_WORKER_GPUS
      (default 1.0) from the first bundle that has a GPU key (or VLLM_RAY_BUNDLE_INDICES).
    So the engine's whole GPU share sits in its bundle, the replica actor asks none (it only relays; a
    share of its own would double bundle 0's GPU), and VLLM_RAY_PER_WORKER_GPUS must equal the share: the
    planner puts it in the engine's environment (planner/engine_args.py).
    """
    gpus = options.num_gpus or 0
    actor = options.as_dict()
    for key in ("num_cpus", "num_gpus"):
        actor.pop(key, None)
    bundle: dict = {"CPU": max(0.05, options.num_cpus - REPLICA_ACTOR_CPUS), **(options.resources or {})}
    if gpus:
        bundle["GPU"] = gpus
    return {**actor, "num_cpus": REPLICA_ACTOR_CPUS}, bundle


# On a discrete GPU (PoolSpec.unified false) the pool is the device's memory: only these plan lines live
# there. The rest (each process's host runtime, mapped files, Ray's own processes, the index, SQLite) is
# host memory, reported beside the pool and given to Ray as the replica's logical `memory`.
DEVICE_LINE_PREFIXES = (
    "weights",
    "kv_pool",
    "drafter.",
    "recurrent_state",
    "activations",
    "cuda_context",
    "cuda_graphs",
)


# Device lines a replica releases once a batch or vLLM's profile run is done: at rest on an H100 (2026-12-06,
# configs/h100.yaml, three boots) the 27B's worker held 69.67 GiB against 69.72 planned without them, and the
# embedder (which empties torch's cache after each call) 772 MiB against 763 (docs/GPU.md).
RELEASED_AT_REST_PREFIXES = ("activations", "drafter.activations")


def released_at_rest(device_lines: dict[str, int]) -> int:
    """The part of a replica's device lines not resident at rest (its growth_bytes on a discrete GPU)."""
    return sum(v for k, v in device_lines.items() if k.startswith(RELEASED_AT_REST_PREFIXES))


def split_device_lines(breakdown: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """(device lines, host lines) of one replica's plan on a discrete GPU."""
    device = {k: v for k, v in breakdown.items() if k.startswith(DEVICE_LINE_PREFIXES)}
    return device, {k: v for k, v in breakdown.items() if k not in device}


def rank_bundles(ranks: list[RayActorOptions]) -> list[dict]:
    """A split engine's placement bundles, one per rank in vLLM's rank order, each from the options of the
    node the rank is planned on (rank 0: the replica's own): each carries its node's placement resource,
    so every worker lands on the node whose pool plans it."""
    return [engine_placement(options)[1] for options in ranks]
