"""Extraction in bounded worker processes, so a pathological upload costs its tenant, not the gateway.

`workers` worker processes (`python -m rag.documents.extract_child`, children of the gateway) have imported
the parsers once; each takes one document at a time and extracts it in a fresh forked child with a
CPU-time cap (RLIMIT_CPU), an address-space cap (RLIMIT_AS) and a wall-time limit. A child that dies
at its cap takes nothing else with it, and its exact CPU time comes back (wait4) to be charged to
the tenant. The caps are planner/profile.py ExtractionSpec's.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass

from rag.documents.extract import Extracted, normalize_content_type
from rag.documents.extract_child import read_frame, write_frame


@dataclass(frozen=True)
class ExtractionLimits:
    """planner/profile.py ExtractionSpec, as the worker pool reads it."""

    workers: int
    cpu_seconds: int
    memory_bytes: int
    wall_seconds: float
    max_locations: int
    cpu_nice: int = 0


@dataclass(frozen=True)
class ExtractionResult:
    extracted: Extracted
    cpu_seconds: float


class ExtractionFailed(Exception):
    """The document could not be extracted. `status` is the HTTP status the client gets (413 over the
    memory cap, 422 otherwise), `cpu_seconds` what it cost before it stopped."""

    def __init__(self, status: int, message: str, cpu_seconds: float = 0.0):
        super().__init__(message)
        self.status = status
        self.cpu_seconds = cpu_seconds


class _Worker:
    """One worker process and its pipes; used by one extraction at a time."""

    def __init__(self):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rag.documents.extract_child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )

    def exchange(self, job: dict, content: bytes) -> dict | None:
        try:
            write_frame(self.process.stdin, json.dumps(job).encode())
            write_frame(self.process.stdin, content)
            answer = read_frame(self.process.stdout)
        except (BrokenPipeError, OSError):
            answer = None
        return json.loads(answer) if answer else None

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class ExtractionPool:
    """At most `limits.workers` extractions at once; `extract` waits for a free worker."""

    def __init__(self, limits: ExtractionLimits):
        self.limits = limits
        self._idle: list[_Worker] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(limits.workers)

    def start(self) -> None:
        """Start every worker now (each imports the parsers: about a second) instead of at first use."""
        with self._lock:
            while len(self._idle) < self.limits.workers:
                self._idle.append(_Worker())

    def pids(self) -> list[int]:
        with self._lock:
            return [worker.process.pid for worker in self._idle]

    def close(self) -> None:
        with self._lock:
            workers, self._idle = self._idle, []
        for worker in workers:
            worker.close()

    async def extract(self, content: str | bytes, content_type: str) -> ExtractionResult:
        return await asyncio.to_thread(self.extract_blocking, content, content_type)

    def extract_blocking(self, content: str | bytes, content_type: str) -> ExtractionResult:
        job = {
            "content_type": normalize_content_type(content_type),
            "binary": isinstance(content, bytes),
            "cpu_seconds": self.limits.cpu_seconds,
            "memory_bytes": self.limits.memory_bytes,
            "wall_seconds": self.limits.wall_seconds,
            "max_locations": self.limits.max_locations,
            "cpu_nice": self.limits.cpu_nice,
        }
        data = content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass")
        with self._slots:
            with self._lock:
                worker = self._idle.pop() if self._idle else None
            worker = worker or _Worker()
            answer = worker.exchange(job, data)
            if answer is None:  # the worker itself died: replace it
                worker.close()
                raise ExtractionFailed(422, "the extraction worker stopped before it answered")
            with self._lock:
                self._idle.append(worker)
        return self._result(answer)

    def _result(self, answer: dict) -> ExtractionResult:
        reply, cpu, limits = answer["reply"], float(answer["cpu_seconds"]), self.limits
        if reply and "ok" in reply:
            return ExtractionResult(Extracted(**reply["ok"]), cpu)
        if reply:
            raise ExtractionFailed(reply["status"], reply["error"], cpu)
        if answer["overran"]:
            raise ExtractionFailed(
                422,
                f"extracting it took more than {limits.wall_seconds:g} s of wall time (rag.extraction.wall_seconds)",
                cpu,
            )
        if answer["signal"] in (signal.SIGXCPU, signal.SIGKILL) and cpu >= limits.cpu_seconds - 0.05:
            raise ExtractionFailed(
                422,
                f"extracting it needs more than the {limits.cpu_seconds} s CPU-time cap (rag.extraction.cpu_seconds)",
                cpu,
            )
        ended = f"; the child ended with signal {answer['signal']}" if answer["signal"] is not None else ""
        raise ExtractionFailed(
            413,
            f"extracting it needs more than the {limits.memory_bytes // 2**20} MiB memory "
            f"cap (rag.extraction.memory_bytes){ended}",
            cpu,
        )
