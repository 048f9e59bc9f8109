"""Measured memory of a replica: RSS of its process and every descendant (vLLM's EngineCore, Worker)."""

from __future__ import annotations

import os

import psutil


def process_tree_rss(pid: int | None = None) -> dict:
    root = psutil.Process(pid or os.getpid())
    processes = [root, *root.children(recursive=True)]
    total, pids = 0, []
    for process in processes:
        try:
            total += process.memory_info().rss
            pids.append(process.pid)
        except psutil.NoSuchProcess:
            continue
    return {"measured_bytes": total, "pids": pids}
