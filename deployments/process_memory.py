"""Measured memory of a replica: RSS of its process and every descendant (vLLM's EngineCore, Worker)."""

from __future__ import annotations

import ctypes
import gc
import os

import psutil


def release_freed_heap(collect: bool = True) -> None:
    """Hand memory Python and glibc hold only as free lists back to the shared pool.

    On a unified-memory machine a page a CPU replica keeps after freeing it is a page the GPU
    cannot use, and it makes a replica's footprint depend on its history rather than its plan.
    """
    if collect:
        gc.collect()
    # The process's own symbols include glibc's; find_library would run ldconfig on every call.
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


def process_tree_rss(pid: int | None = None) -> dict:
    """RSS of this process (after releasing its freed heap) and of every process it started,
    with the kernel's split into anonymous, file-backed and shared-memory pages."""
    if pid is None:
        release_freed_heap()
    root = psutil.Process(pid or os.getpid())
    processes = [root, *root.children(recursive=True)]
    total, pids, parts = 0, [], {"anon_bytes": 0, "file_bytes": 0, "shmem_bytes": 0}
    for process in processes:
        try:
            total += process.memory_info().rss
            for name, value in _rss_parts(process.pid).items():
                parts[name] += value
            pids.append(process.pid)
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            continue
    return {"measured_bytes": total, "pids": pids, **parts}


def _rss_parts(pid: int) -> dict[str, int]:
    """RssAnon / RssFile / RssShmem from /proc (Linux); empty elsewhere."""
    fields = {"RssAnon:": "anon_bytes", "RssFile:": "file_bytes", "RssShmem:": "shmem_bytes"}
    parts = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                words = line.split()
                if words and words[0] in fields:
                    parts[fields[words[0]]] = int(words[1]) * 1024
    except OSError:
        return {}
    return parts
