"""The CPU chat engine's vLLM worker: all its cores for a prefill, fewer for a decode step.

On a small host the chat engine shares its cores with the embedder, the gateway and Ray. A second OpenMP
thread nearly doubles a prompt's prefill (1.85-1.93x idle, 1.10-1.22x beside a busy core) but, beside a
busy core, slows decoding by a third (0.72x / 0.64x): a decode step is many short parallel regions, and
each waits for the thread that lost its core (docs/BENCHMARKS.md section 2d'). So a step that schedules
at least `POOLSERVE_WIDE_STEP_TOKENS` tokens (a prompt's prefill) runs on the plan's `OMP_NUM_THREADS`,
and any other step (decoding, speculation's few tokens per sequence) on `POOLSERVE_NARROW_STEP_THREADS`.
The planner sets both (planner/engine.py); the thread team and its core binding stay as vLLM made them,
only the number of threads a parallel region uses changes.
"""

from __future__ import annotations

import os

import torch
from vllm.v1.worker.cpu_worker import CPUWorker

from planner.engine import NARROW_STEP_THREADS_ENV, WIDE_STEP_TOKENS_ENV


def step_threads(scheduled_tokens: int, wide_threads: int, narrow_threads: int, wide_step_tokens: int) -> int:
    """OpenMP threads for one engine step of `scheduled_tokens` tokens."""
    return wide_threads if scheduled_tokens >= wide_step_tokens else min(narrow_threads, wide_threads)


class StepThreadsCPUWorker(CPUWorker):
    """vLLM's CPU worker, with the number of OpenMP threads chosen per step (see the module's doc)."""

    def init_device(self):
        # vLLM replaces torch.set_num_threads with a no-op once the threads are bound; keep the real one.
        self._set_threads = torch._C.set_num_threads
        super().init_device()
        self._wide_threads = torch.get_num_threads()
        self._narrow_threads = int(os.environ.get(NARROW_STEP_THREADS_ENV, self._wide_threads))
        self._wide_step_tokens = int(os.environ.get(WIDE_STEP_TOKENS_ENV, 1))
        self._threads = self._wide_threads

    def execute_model(self, scheduler_output):
        threads = step_threads(scheduler_output.total_num_scheduled_tokens, self._wide_threads,
                               self._narrow_threads, self._wide_step_tokens)
        if threads != self._threads:
            self._set_threads(threads)
            self._threads = threads
        return super().execute_model(scheduler_output)
