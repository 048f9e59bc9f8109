"""Unit tests plan for one host: a CPU that computes bfloat16 natively, whatever runs the tests
(`dtype: auto` would otherwise follow this machine's /proc/cpuinfo)."""

import pytest


@pytest.fixture(autouse=True)
def _native_bf16_host(monkeypatch):
    monkeypatch.setattr("planner.plan.detect_cpu_native_bf16", lambda: True)
