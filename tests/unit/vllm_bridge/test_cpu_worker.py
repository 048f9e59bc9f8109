"""vllm_bridge/cpu_worker.py: a step of at least the wide-step threshold runs on every planned thread, others on fewer;
the Worker busy-waits for its next step only as long as planned."""

from types import SimpleNamespace

import pytest

from planner.step_worker import STEP_WORKER_ENV, StepWorkerSettings
from vllm_bridge import cpu_worker  # vLLM is in the `cpu` extra: an import that fails here is a failure, not a skip


def test_step_threads_by_scheduled_tokens():
    assert cpu_worker.step_threads(800, 2, 1, 128) == 2  # a RAG prompt's prefill
    assert cpu_worker.step_threads(128, 2, 1, 128) == 2
    assert cpu_worker.step_threads(80, 2, 1, 128) == 1  # 16 sequences decoding with 4 speculative tokens
    assert cpu_worker.step_threads(1, 4, 8, 128) == 4  # never more than the team vLLM bound


def test_the_worker_switches_threads_only_when_a_step_needs_another_count(monkeypatch):
    calls, ran = [], []
    monkeypatch.setattr(cpu_worker.CPUWorker, "execute_model", lambda self, out: ran.append(out) or "output")
    worker = object.__new__(cpu_worker.StepThreadsCPUWorker)
    worker._set_threads, worker._wide_threads, worker._narrow_threads = calls.append, 2, 1
    worker._wide_step_tokens, worker._threads = 128, 2
    for tokens in (900, 5, 5, 80, 300, 2048, 1):
        assert worker.execute_model(SimpleNamespace(total_num_scheduled_tokens=tokens)) == "output"
    assert calls == [1, 2, 1] and len(ran) == 7


def test_the_worker_limits_the_busy_wait_of_the_queue_readers_it_makes_next(monkeypatch):
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    monkeypatch.setattr(SpinCondition.__init__, "__defaults__", SpinCondition.__init__.__defaults__)  # restored after
    assert SpinCondition.__init__.__defaults__[-1] == 1  # vLLM's: a second of sched_yield after every step
    monkeypatch.setattr(cpu_worker.CPUWorker, "__init__", lambda self, *args, **kwargs: None)
    monkeypatch.delenv(STEP_WORKER_ENV, raising=False)
    cpu_worker.StepThreadsCPUWorker()
    assert SpinCondition.__init__.__defaults__[-1] == 1  # not planned: vLLM's own
    planned = StepWorkerSettings(narrow_step_threads=1, wide_step_tokens=128, idle_spin_s=0.05)
    monkeypatch.setenv(STEP_WORKER_ENV, planned.as_env()[STEP_WORKER_ENV])
    cpu_worker.StepThreadsCPUWorker()
    assert SpinCondition.__init__.__defaults__[-1] == 0.05


def test_a_vllm_whose_spin_condition_changed_is_a_clear_error(monkeypatch):
    from vllm.distributed.device_communicators import shm_broadcast

    class Changed:
        def __init__(self, is_reader, context, notify_address, spin_seconds=1.0):
            pass

    monkeypatch.setattr(cpu_worker, "SpinCondition", Changed)
    with pytest.raises(RuntimeError, match="busy_loop_s"):
        cpu_worker.limit_idle_spin(0.05)
    assert shm_broadcast.SpinCondition.__init__.__defaults__[-1] == 1
