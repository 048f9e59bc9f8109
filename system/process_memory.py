"""Measured memory of a replica: its unique share of the pool (PSS) for its process and every
descendant (vLLM's EngineCore, Worker), with RSS beside it.

Budgets count unique memory: a page of libtorch mapped by six replicas is one page of the pool, so
each process is charged 1/6 of it (the kernel's proportional set size), not all of it (RSS).
Summed over every process of the stack, PSS is what the stack takes from the pool.
"""

from __future__ import annotations

import ctypes
import gc
import os

import psutil

# /proc/<pid>/smaps_rollup fields (kB) -> the keys /status reports.
_ROLLUP_FIELDS = {
    "Pss:": "measured_bytes",
    "Pss_Anon:": "anon_bytes",
    "Pss_File:": "file_bytes",
    "Pss_Shmem:": "shmem_bytes",
    "Rss:": "rss_bytes",
}


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


def process_tree_memory(pid: int | None = None) -> dict:
    """Unique memory (PSS) of this process (after releasing its freed heap) and of every process it
    started, split into anonymous, file-backed and shared-memory pages, with the tree's RSS."""
    if pid is None:
        release_freed_heap()
    root = psutil.Process(pid or os.getpid())
    return processes_memory([root.pid, *(child.pid for child in root.children(recursive=True))])


def processes_memory(pids) -> dict:
    """The same sums over these processes, those still running (the pids read are returned with them)."""
    totals = dict.fromkeys(_ROLLUP_FIELDS.values(), 0)
    read = []
    for pid in pids:
        parts = _rollup(pid)
        if not parts:
            continue
        for key, value in parts.items():
            totals[key] += value
        read.append(pid)
    return {**totals, "pids": read}


def processes_resident_bytes(pids) -> int:
    """The resident bytes (RSS) of these processes, those still running, from /proc/<pid>/statm: constant time,
    where smaps_rollup walks every mapped page (95 ms for 8 GiB of 4 KiB pages, such as a sleeping engine's
    pinned host copies)."""
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:  # it ended meanwhile
            pass
    return total


def _rollup(pid: int) -> dict[str, int]:
    """One process's smaps_rollup (Linux 4.14+); RSS alone where it cannot be read."""
    parts = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                words = line.split()
                if words and words[0] in _ROLLUP_FIELDS:
                    parts[_ROLLUP_FIELDS[words[0]]] = int(words[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return {}
    except OSError:
        parts = {}
    if "measured_bytes" not in parts:
        try:
            rss = psutil.Process(pid).memory_info().rss
        except psutil.Error:
            return {}
        parts = {"measured_bytes": rss, "rss_bytes": rss}
    return parts
