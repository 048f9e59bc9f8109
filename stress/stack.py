"""The stack on this machine that `poolserve stress` may kill and restart: found through its serve config
and profile (state dir -> stack id -> the processes carrying POOLSERVE_STACK), never by a process name
alone, so no other stack on the machine is touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

from stackctl.launcher import StackLayout, down
from stackctl.processes import stack_pids

# What identifies each replica among the stack's own processes (tests/integration/test_faults.py
# kills the same ones): vLLM's engine core process, and Ray Serve's replica actors.
TARGETS = {
    "engine": "EngineCore",
    "embedder": "ServeReplica:poolserve:embedder",
    "retriever": "ServeReplica:poolserve:retriever",
    "gateway": "ServeReplica:poolserve:gateway",
}
LAUNCHER_EXIT_S = 180.0


def _parent_of(pid: int) -> int | None:
    try:
        return psutil.Process(pid).ppid()
    except psutil.Error:
        return None


def launches_stack(launcher: int, marked: list[int], parent_of) -> bool:
    """Whether `launcher` is the parent of one of the stack's marked processes (`serve run` is)."""
    return any(parent_of(pid) == launcher for pid in marked)


class StackControl:
    def __init__(self, serve_config: Path, profile_path: Path, state_dir: Path, pool: str | None, log):
        self.serve_config, self.profile_path, self.pool, self.log = serve_config, profile_path, pool, log
        self.layout = StackLayout(state_dir)
        self.restart_log = self.layout.state_dir / "run" / "stress-restart.log"

    def pids(self) -> list[int]:
        return stack_pids(self.layout.stack_id)

    def kill(self, target: str) -> int:
        """SIGKILL the first of this stack's processes whose command line names `target`; returns its pid."""
        fragment = TARGETS[target]
        for pid in self.pids():
            try:
                if fragment in " ".join(psutil.Process(pid).cmdline()):
                    os.kill(pid, signal.SIGKILL)
                    return pid
            except (psutil.Error, ProcessLookupError):
                continue
        raise LookupError(f"no process of stack {self.layout.stack_id} runs {fragment!r}")

    def _launcher_pid(self) -> int | None:
        """stack.yaml's launcher, only while it is this stack's: the parent of a process carrying the
        stack's marker. A stale stack.yaml (the stack gone, its pid reused by anything) names no such
        parent, and that process is never signalled."""
        record = self.layout.run_dir / "stack.yaml"
        try:
            pid = int((yaml.safe_load(record.read_text()) or {}).get("launcher_pid") or 0)
        except (OSError, ValueError, yaml.YAMLError):
            return None
        return pid if pid and launches_stack(pid, self.pids(), _parent_of) else None

    @staticmethod
    def _running(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def stop(self) -> None:
        """SIGTERM the stack's launcher (`poolserve up`, as Ctrl-C would) and wait for it to clean up; then
        end whatever of the stack is left, by its marker."""
        launcher = self._launcher_pid()
        if launcher and self._running(launcher):
            os.kill(launcher, signal.SIGTERM)
            deadline = time.monotonic() + LAUNCHER_EXIT_S
            while self._running(launcher) and time.monotonic() < deadline:
                time.sleep(0.5)
        down(self.layout, log=self.log)

    def start(self, admin_key: str) -> subprocess.Popen:
        """`poolserve up` with the same serve config, profile and pool, detached (it outlives this
        command: the operator's stack keeps running); output goes to state_dir/run/stress-restart.log."""
        command = [sys.executable, "-m", "cli.main", "up", str(self.serve_config), "--profile", str(self.profile_path)]
        if self.pool:
            command += ["--pool", self.pool]
        env = {**os.environ, "POOLSERVE_ADMIN_KEY": admin_key}
        self.restart_log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.restart_log, "ab") as log:
            return subprocess.Popen(
                command,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=Path(__file__).resolve().parents[1],
            )
