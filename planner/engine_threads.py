"""The chat engine's CPU threads: how many for a prefill, how many for a decode step, and the cores they bind."""

from __future__ import annotations

import os
from dataclasses import dataclass

from planner.errors import EngineError
from planner.profile import ChatSpec


@dataclass(frozen=True)
class EngineThreads:
    """OpenMP threads of one chat engine."""

    wide: int  # a prefill's (OMP_NUM_THREADS)
    narrow: int  # a decode step's; below `wide` only with the CPU step-threads worker
    bind: str | None  # VLLM_CPU_OMP_THREADS_BIND on a CPU pool; None on a GPU


def engine_threads(chat: ChatSpec, gpu: bool, cpus: float, other_threads: int) -> EngineThreads:
    """The engine's threads on a pool of `cpus` CPUs beside `other_threads` of the embedder's."""
    if chat.omp_threads and chat.omp_threads > cpus:
        raise EngineError(f"chat.omp_threads {chat.omp_threads} is pinned but the pool has {cpus:g} CPUs")
    one_rank = chat.tensor_parallel_size * chat.pipeline_parallel_size == 1
    wide, narrow = cpu_threads(chat, cpus, other_threads, step_threads=one_rank and not gpu)
    if gpu:
        # On a GPU the threads only feed the device: at most 4 unless pinned.
        threads = wide if chat.omp_threads else min(wide, 4)
        return EngineThreads(threads, threads, None)
    # One rank binds its own core list; ranks split over nodes take the profile's setting as it is.
    return EngineThreads(wide, narrow, omp_bind(chat.omp_bind, wide) if one_rank else chat.omp_bind)


def cpu_threads(chat: ChatSpec, cpus: float, other_threads: int, step_threads: bool) -> tuple[int, int]:
    """OpenMP threads for the engine's prefill steps and for its decode steps.

    On 2 cores a prefill on both runs 1.7-1.9x faster idle (0.86-1.14x beside a busy core, by prompt length),
    while a decode step on both loses a third beside a busy core (0.68x; docs/BENCHMARKS.md section 2.6 and the archived 2d′):
    so, by default, prefill on all the pool's CPUs and decoding on the CPUs the embedder leaves. Without the step
    worker (GPU, several ranks) one number serves both: the CPUs the embedder leaves."""
    leftover = max(1, int(cpus) - other_threads)
    if not step_threads:
        omp = chat.omp_threads or leftover
        return omp, omp
    omp = chat.omp_threads or max(1, int(cpus))
    return omp, min(omp, chat.decode_omp_threads or leftover)


def omp_bind(setting: str, threads: int, allowed_cpus: list[int] | None = None) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for a CPU worker of `threads` OpenMP threads.

    vLLM's 'auto' binds the worker to one core per rank and sets OMP_NUM_THREADS to match, whatever the
    plan asked (vllm/utils/ompmultiprocessing.py keeps the others for its EngineCore); so more than one
    thread needs an explicit core list: the first `threads` CPUs this process may run on. On 2 cores,
    without speculation, prefill ran 1.5-1.6x faster bound to both than under 'auto' (docs/BENCHMARKS.md
    section 2.5)."""
    if setting != "auto" or threads <= 1:
        return setting
    cpus = sorted(allowed_cpus if allowed_cpus is not None else os.sched_getaffinity(0))
    if len(cpus) < threads:
        raise EngineError(
            f"chat: {threads} OpenMP threads planned but this host lets the process run on "
            f"{len(cpus)} CPUs; lower chat.omp_threads or set chat.omp_bind"
        )
    return ",".join(str(c) for c in cpus[:threads])
