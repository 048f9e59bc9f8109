"""Server processes a benchmark starts and always stops: each in its own session (process group), so
that vLLM's EngineCore and worker processes, which it forks, end with it; health waits are bounded.

    with raw_vllm_server(setup, workdir) as url: ...     # vLLM's OpenAI server on a free port
    run_in_own_session([python, script, "--worker"], env, log, timeout=600)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench.harness.cpu_accounting import process_tree
from bench.harness.engine import EngineSetup, raw_vllm_command

ROOT = Path(__file__).resolve().parents[2]
HEALTH_POLL_S = 2.0
STOP_GRACE_S = 60.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus `extra`, with this checkout first on PYTHONPATH: a child (and Ray's
    workers, which inherit it) imports the code under test, not another checkout's editable install."""
    env = {**os.environ, **(extra or {})}
    paths = [str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


@dataclass
class ProcessGroup:
    """A process started as the leader of a new session; stop() ends the whole group."""

    process: subprocess.Popen
    log_path: Path

    @classmethod
    def start(cls, command: list[str], env: Mapping[str, str], log_path: Path, cwd: Path = ROOT) -> ProcessGroup:
        with open(log_path, "ab") as log:  # the child keeps its own copy of the descriptor
            process = subprocess.Popen(
                command, cwd=cwd, env=dict(env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        return cls(process, log_path)

    def running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the group, wait up to grace_s for the leader, then SIGKILL whatever is left of the group."""
        self._signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        self._signal(signal.SIGKILL)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # unkillable (D state): reported, not waited for forever
            pass

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass


class ServerFailed(RuntimeError):
    pass


def wait_healthy(url: str, group: ProcessGroup, timeout_s: float, headers: Mapping[str, str] | None = None) -> float:
    """Seconds until GET url answers 200; ServerFailed if the server exits or timeout_s passes first."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if not group.running():
            raise ServerFailed(
                f"server exited ({group.process.returncode}) before {url} was healthy; "
                f"log {group.log_path}:\n{group.log_tail()}"
            )
        try:
            if httpx.get(url, timeout=5, headers=dict(headers or {})).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(HEALTH_POLL_S)
    raise ServerFailed(f"{url} not healthy after {timeout_s:.0f}s; log {group.log_path}:\n{group.log_tail()}")


@dataclass(frozen=True)
class RunningServer:
    base_url: str  # without /v1
    api_key: str | None
    start_s: float  # start to healthy
    pids: Callable[[], list[int]] = list  # the server's processes now (for CPU accounting)
    metrics_url: str | None = None  # where the engine's Prometheus counters are (spec_metrics.py)


@contextmanager
def raw_vllm_server(setup: EngineSetup, workdir: Path, timeout_s: float = 300) -> Iterator[RunningServer]:
    """vLLM's OpenAI server with the setup's arguments and the plan's environment, stopped on exit."""
    from vllm_bridge.compat import adapt_engine_env  # the env as the installed vLLM accepts it

    port = free_port()
    group = ProcessGroup.start(
        raw_vllm_command(setup, port), child_env(adapt_engine_env(setup.env)), workdir / "vllm.log"
    )
    try:
        start_s = wait_healthy(f"http://127.0.0.1:{port}/health", group, timeout_s)
        yield RunningServer(
            f"http://127.0.0.1:{port}",
            None,
            start_s,
            lambda: process_tree(group.process.pid),
            f"http://127.0.0.1:{port}/metrics",
        )
    finally:
        group.stop()


def run_result_worker(command: list[str], env: Mapping[str, str], log_path: Path, timeout_s: float, label: str) -> dict:
    """Run a worker that prints its result as one `RESULT <json>` line (run_in_own_session); that result,
    or SystemExit with the log's tail when it printed none."""
    run_in_own_session(command, env, log_path, timeout_s)
    output = log_path.read_text()
    line = next((ln for ln in output.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"{label} failed; log {log_path}:\n{output[-3000:]}")
    return json.loads(line[len("RESULT ") :])


def run_in_own_session(command: list[str], env: Mapping[str, str], log_path: Path, timeout_s: float) -> int | None:
    """Run a worker to completion in its own session, output to log_path; its exit code, None on a
    timeout. Whatever it started in its session is killed with it, always."""
    group = ProcessGroup.start(command, env, log_path)
    try:
        return group.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None
    finally:
        group.stop(grace_s=0)
