"""Where the CPU goes during a load: CPU seconds per process role, read from /proc before and after.

    with CpuAccount(pids_fn) as account:
        run_load()
    account.by_role()   # {"vLLM worker": 41.2, "gateway replica": 3.1, ...} CPU seconds

A role is the process's title (Ray sets `ray::ServeReplica:app:Gateway`, vLLM `VLLM::EngineCore`), so
the same role sums over restarts and threads. Processes that start during the load count from zero;
processes that end during it are lost (their time is not readable afterwards), so keep loads steady.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

# Titles to roles, first match wins; anything else keeps its process name.
ROLE_PATTERNS = (
    (re.compile(r"ServeReplica:[^:]+:LLMServer|ServeReplica:.*LLM"), "LLMServer replica"),
    (re.compile(r"ServeReplica:[^:]+:(\w+)"), None),  # None: the deployment's own name
    (re.compile(r"ProxyActor"), "Serve proxy"),
    (re.compile(r"ServeController"), "Serve controller"),
    (re.compile(r"EngineCore"), "vLLM EngineCore"),
    # Before the worker's pattern: the server's command line names the worker class (--worker-cls).
    (re.compile(r"vllm\.entrypoints\.openai\.api_server|api_server"), "vLLM API server"),
    (re.compile(r"VllmWorker|Worker_TP|worker", re.I), "vLLM worker"),
    (re.compile(r"raylet"), "raylet"),
    (re.compile(r"gcs_server"), "GCS"),
)


def role_of(title: str, name: str) -> str:
    for pattern, role in ROLE_PATTERNS:
        match = pattern.search(title)
        if match:
            return role or f"{match.group(1)} replica"
    return name


def _cpu_seconds(process: psutil.Process) -> tuple[str, float] | None:
    try:
        with process.oneshot():
            times = process.cpu_times()
            title = " ".join(process.cmdline()) or process.name()
            return role_of(title, process.name()), times.user + times.system
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


@dataclass
class CpuAccount:
    """CPU seconds each role used between __enter__ and __exit__, over the processes pids_fn names."""

    pids_fn: Callable[[], list[int]]
    start: dict[int, tuple[str, float]] = field(default_factory=dict)
    end: dict[int, tuple[str, float]] = field(default_factory=dict)

    def _read(self) -> dict[int, tuple[str, float]]:
        readings = {}
        for pid in self.pids_fn():
            try:
                reading = _cpu_seconds(psutil.Process(pid))
            except psutil.NoSuchProcess:
                continue
            if reading:
                readings[pid] = reading
        return readings

    def __enter__(self) -> CpuAccount:
        self.start = self._read()
        return self

    def __exit__(self, *exc) -> None:
        self.end = self._read()

    def by_role(self) -> dict[str, float]:
        used: dict[str, float] = {}
        for pid, (role, seconds) in self.end.items():
            before = self.start.get(pid, (role, 0.0))[1]
            used[role] = used.get(role, 0.0) + max(0.0, seconds - before)
        return dict(sorted(used.items(), key=lambda item: -item[1]))


def process_tree(pid: int) -> list[int]:
    """pid and all its descendants (raw vLLM: the API server, its EngineCore and workers)."""
    try:
        root = psutil.Process(pid)
        return [pid, *(child.pid for child in root.children(recursive=True))]
    except psutil.NoSuchProcess:
        return []
