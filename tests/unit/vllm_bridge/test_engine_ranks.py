"""A split CPU engine's lifetimes (vllm_bridge/engine_ranks.py, vllm_bridge/headless.py), with real processes:
the headless ranks end their group when their parent goes, even SIGKILLed, and a replica whose rank is
lost ends its own EngineCore tree and nothing else."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[3]
WAIT_S = 15.0


def _gone(pid: int, timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_the_headless_group_ends_itself_when_its_parent_is_sigkilled(tmp_path):
    # parent -> headless stand-in (own session, watching its parent as vllm_bridge.headless does) -> worker
    pids = tmp_path / "pids"
    headless = textwrap.dedent(f"""
        import os, subprocess, sys, threading, time
        from vllm_bridge import headless
        headless.PARENT_POLL_S = 0.1
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(pids)!r}, "w").write(f"{{os.getpid()}} {{worker.pid}}")
        threading.Thread(target=headless._end_group_when_orphaned, args=(os.getppid(),), daemon=True).start()
        time.sleep(120)
    """)
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", {headless!r}], start_new_session=True)
        time.sleep(120)
    """),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while not (pids.exists() and pids.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.1)
        rank, worker = map(int, pids.read_text().split())
        assert not _gone(rank, 0.5) and not _gone(worker, 0.1)
        parent.kill()  # SIGKILL: no cleanup of its own runs
        parent.wait(timeout=WAIT_S)
        assert _gone(rank) and _gone(worker), "the headless ranks outlived their parent"
    finally:
        parent.kill()
        for pid in map(int, pids.read_text().split()) if pids.exists() and pids.read_text().strip() else []:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_replica_that_lost_a_rank_ends_its_engine_core_tree_and_nothing_else(tmp_path):
    pids = tmp_path / "pids"
    script = textwrap.dedent(f"""
        import subprocess, sys, time
        from vllm_bridge.engine_ranks import end_local_engine
        core = subprocess.Popen([sys.executable, "-c",
                                 "import subprocess, sys, time; w = subprocess.Popen([sys.executable, '-c', "
                                 "'import time; time.sleep(120)']); print(w.pid, flush=True); time.sleep(120)",
                                 "VLLM::EngineCore"], stdout=subprocess.PIPE, text=True)
        worker = int(core.stdout.readline())
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        open({str(pids)!r}, "w").write(f"{{core.pid}} {{worker}} {{other.pid}}")
        print("ENDED", end_local_engine(), flush=True)
        core.wait(timeout=10)
        time.sleep(1)
        print("OTHER", other.poll(), flush=True)
        other.kill()
    """)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    core, worker, other = map(int, pids.read_text().split())
    try:
        assert "ENDED 2" in done.stdout, done.stdout + done.stderr
        assert "OTHER None" in done.stdout  # the process that is not the engine's still ran
        assert _gone(core) and _gone(worker)
    finally:
        for pid in (core, worker, other):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
