"""planner/step_worker.py: the name vLLM gets for the CPU step-threads worker is that class, and its settings cross
into the Worker's process as one validated object."""

import importlib

import pytest
from pydantic import ValidationError

from planner.step_worker import STEP_THREADS_WORKER, STEP_WORKER_ENV, StepWorkerSettings, step_threads


def test_the_worker_name_the_planner_gives_vllm_resolves_to_the_worker_class():
    from vllm_bridge.cpu_worker import StepThreadsCPUWorker

    module, name = STEP_THREADS_WORKER.rsplit(".", 1)
    assert getattr(importlib.import_module(module), name) is StepThreadsCPUWorker


def test_the_settings_cross_as_one_variable_and_come_back_equal():
    settings = StepWorkerSettings(narrow_step_threads=1, wide_step_tokens=128, idle_spin_s=0.05)
    env = settings.as_env()
    assert list(env) == [STEP_WORKER_ENV]
    assert StepWorkerSettings.from_env(env) == settings
    assert StepWorkerSettings.from_env({}) is None  # not planned: the worker behaves as vLLM's


def test_settings_out_of_range_are_refused_on_both_sides():
    with pytest.raises(ValidationError):
        StepWorkerSettings(narrow_step_threads=0, wide_step_tokens=128, idle_spin_s=0.05)
    with pytest.raises(ValidationError):
        StepWorkerSettings.from_env(
            {STEP_WORKER_ENV: '{"narrow_step_threads": 1, "wide_step_tokens": 128, "idle_spin_s": 5}'}
        )
    with pytest.raises(ValidationError):  # a key the worker does not know is an error, not ignored
        StepWorkerSettings.from_env(
            {STEP_WORKER_ENV: '{"narrow_step_threads": 1, "wide_step_tokens": 128, "idle_spin_s": 0.05, "narrow": 2}'}
        )


def test_a_step_of_at_least_the_wide_step_tokens_runs_on_every_thread():
    assert step_threads(128, 2, 1, 128) == 2 and step_threads(127, 2, 1, 128) == 1


def test_the_worker_takes_its_thread_counts_from_the_settings(monkeypatch):
    from vllm_bridge import cpu_worker

    monkeypatch.setattr(cpu_worker.CPUWorker, "init_device", lambda self: None)
    monkeypatch.setattr(cpu_worker.torch, "get_num_threads", lambda: 2)
    worker = object.__new__(cpu_worker.StepThreadsCPUWorker)
    worker._settings = StepWorkerSettings(narrow_step_threads=1, wide_step_tokens=64, idle_spin_s=0.05)
    worker.init_device()
    assert (worker._wide_threads, worker._narrow_threads, worker._wide_step_tokens) == (2, 1, 64)
    worker._settings = StepWorkerSettings(narrow_step_threads=None, wide_step_tokens=64, idle_spin_s=0.05)
    worker.init_device()
    assert worker._narrow_threads == 2  # no narrow count: every step on the engine's threads
    worker._settings = None
    worker.init_device()
    assert (worker._narrow_threads, worker._wide_step_tokens) == (2, 1)  # not planned: vLLM's behaviour
