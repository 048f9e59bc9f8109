"""Replica memory measurement: the tree's unique memory (PSS), after freed heap goes back to the OS."""

from __future__ import annotations

import subprocess
import sys

import psutil

from system.process_memory import (
    process_tree_memory,
    processes_memory,
    processes_resident_bytes,
    release_freed_heap,
)


def test_tree_memory_counts_this_process_and_its_children():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        measured = process_tree_memory()
        assert child.pid in measured["pids"]
        own = psutil.Process().memory_info().rss
        assert measured["rss_bytes"] > own
        # The child maps the same interpreter and libraries: their pages are shared, so the tree's
        # unique memory is less than the sum of RSS, and it splits into anonymous + file + shmem.
        assert 0 < measured["measured_bytes"] < measured["rss_bytes"]
        parts = measured["anon_bytes"] + measured["file_bytes"] + measured["shmem_bytes"]
        assert abs(parts - measured["measured_bytes"]) <= 64 * 1024 * len(measured["pids"])
    finally:
        child.kill()
        child.wait(timeout=10)


def test_resident_bytes_from_statm_equal_smaps_rss_and_skip_ended_processes():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pids = [child.pid, 2**22 + 12345]  # the second runs nowhere
        for _ in range(50):  # the child's interpreter may still be mapping pages: compare two quiet readings
            first = processes_memory(pids)["rss_bytes"]
            statm = processes_resident_bytes(pids)
            if first == processes_memory(pids)["rss_bytes"]:
                break
        assert abs(statm - first) <= 256 * 1024
        assert processes_resident_bytes([]) == 0
    finally:
        child.kill()
        child.wait(timeout=10)


def test_release_returns_freed_blocks_to_the_os():
    # Small blocks come from the heap, not mmap; one block kept above them stops glibc's own trim of
    # the heap top, so freeing them alone leaves the RSS where it was (as a torch batch's would).
    blocks = [bytearray(4096) for _ in range(60_000)]
    pinned_above = bytearray(4096)
    for block in blocks:
        block[0] = 1
    del blocks, block
    freed_but_held = psutil.Process().memory_info().rss
    release_freed_heap()
    assert psutil.Process().memory_info().rss < freed_but_held - 100 * 2**20
    assert pinned_above[0] == 0
