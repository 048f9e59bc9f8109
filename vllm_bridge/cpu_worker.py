"""The CPU chat engine's vLLM worker: all its cores for a prefill, fewer for a decode step.

On a small host the chat engine shares its cores with the embedder, the gateway and Ray. A second OpenMP
thread nearly doubles a prompt's prefill (1.85-1.93x idle, 1.10-1.22x beside a busy core) but, beside a
busy core, slows decoding by a third (0.72x / 0.64x): a decode step is many short parallel regions, and
each waits for the thread that lost its core (docs/BENCHMARKS.md section 2.6). So a step that schedules
at least `wide_step_tokens` tokens (a prompt's prefill) runs on the plan's `OMP_NUM_THREADS`, and any
other step (decoding, speculation's few tokens per sequence) on `narrow_step_threads`. The planner sets both
in one StepWorkerSettings (planner/step_worker.py); the thread team and its core binding stay as vLLM made
them, only the number of threads a parallel region uses changes.

Between steps the Worker waits for the next on a shared-memory queue: vLLM busy-waits (sched_yield) for
a second after each step before it sleeps on the queue's socket, which on a GPU host costs a spare core
and here holds one of two cores for a second after every request, beside the other tenants' requests
and the embedder. The Worker busy-waits for the settings' `idle_spin_s` instead (chat.worker_idle_spin_s).
"""

from __future__ import annotations

import inspect
import os

import torch
from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
from vllm.v1.worker.cpu_worker import CPUWorker

from planner.step_worker import STEP_THREADS_WORKER, StepWorkerSettings, step_threads


def limit_idle_spin(seconds: float) -> None:
    """Queue readers created from now on in this process busy-wait `seconds` after a read, not vLLM's 1 s.
    The Worker makes its step queue's reader after it makes the worker (WorkerProc.__init__), so a worker's
    __init__ is early enough."""
    init = SpinCondition.__init__
    last = list(inspect.signature(init).parameters)[-1]
    if last != "busy_loop_s" or not init.__defaults__:
        raise RuntimeError(
            f"vLLM's SpinCondition no longer ends with busy_loop_s (it ends with {last!r}): "
            f"vllm_bridge/cpu_worker.py cannot limit the Worker's busy-wait"
        )
    init.__defaults__ = (*init.__defaults__[:-1], seconds)


class StepThreadsCPUWorker(CPUWorker):
    """vLLM's CPU worker, with the number of OpenMP threads chosen per step and a short busy-wait between
    steps (see the module's doc)."""

    def __init__(self, *args, **kwargs):
        self._settings = StepWorkerSettings.from_env(os.environ)
        if self._settings is not None:
            limit_idle_spin(self._settings.idle_spin_s)
        super().__init__(*args, **kwargs)

    def init_device(self):
        # vLLM replaces torch.set_num_threads with a no-op once the threads are bound; keep the real one.
        self._set_threads = torch._C.set_num_threads
        super().init_device()
        self._wide_threads = torch.get_num_threads()
        settings = self._settings
        self._narrow_threads = (settings and settings.narrow_step_threads) or self._wide_threads
        self._wide_step_tokens = settings.wide_step_tokens if settings else 1
        self._threads = self._wide_threads

    def execute_model(self, scheduler_output):
        threads = step_threads(
            scheduler_output.total_num_scheduled_tokens,
            self._wide_threads,
            self._narrow_threads,
            self._wide_step_tokens,
        )
        if threads != self._threads:
            self._set_threads(threads)
            self._threads = threads
        return super().execute_model(scheduler_output)


# The planner names this class by string for vLLM (planner/step_worker.py): a rename must move both together.
if f"{__name__}.{StepThreadsCPUWorker.__qualname__}" != STEP_THREADS_WORKER:
    raise ImportError(
        f"planner.step_worker.STEP_THREADS_WORKER names {STEP_THREADS_WORKER!r}, not this class "
        f"({__name__}.{StepThreadsCPUWorker.__qualname__})"
    )
