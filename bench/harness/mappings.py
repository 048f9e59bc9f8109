"""A process's resident memory by kind of mapping, read from /proc/PID/smaps (no debugger, no signal).

The kinds: the main glibc heap ([heap]), glibc's other arenas (anonymous mappings that start on a 64 MiB
boundary: each thread arena's heap is one), other anonymous mappings (Python's object arenas, mmapped blocks,
thread stacks), and mapped files. bench/heap_by_mapping.py reads another process with it;
bench/probe_embedder_memory.py its own.
"""

from __future__ import annotations

ARENA_ALIGN = 64 * 2**20  # glibc's HEAP_MAX_SIZE on 64-bit: every non-main arena heap starts on it


def read_smaps(pid: int | str = "self") -> list[dict]:
    """Each mapping of /proc/PID/smaps: start address, size, permissions, name, and Rss / Pss / Anonymous in KiB."""
    maps, current = [], None
    with open(f"/proc/{pid}/smaps") as smaps:
        for line in smaps:
            first = line.split(None, 1)[0]
            if "-" in first and not first.endswith(":"):
                parts = line.split()
                start, end = (int(x, 16) for x in first.split("-"))
                current = {
                    "start": start,
                    "kib": (end - start) // 1024,
                    "perm": parts[1],
                    "name": parts[5] if len(parts) > 5 else "",
                }
                maps.append(current)
            elif first in ("Rss:", "Pss:", "Anonymous:") and current is not None:
                current[first[:-1].lower()] = int(line.split()[1])
    return maps


def kind_of(mapping: dict) -> str:
    name = mapping["name"]
    if name == "[heap]":
        return "main heap"
    if name.startswith("/"):
        return "file"
    if name.startswith("["):
        return "other anon"  # [stack], [vdso], ...
    if mapping["start"] % ARENA_ALIGN == 0 and mapping["perm"] == "rw-p":
        return "arena"
    return "other anon"


def summary(maps: list[dict]) -> dict:
    out = {"main heap": 0.0, "arena": 0.0, "other anon": 0.0, "file": 0.0, "file pss": 0.0}
    arenas = []
    for mapping in maps:
        kind = kind_of(mapping)
        out[kind] += mapping.get("rss", 0) / 1024
        if kind == "file":
            out["file pss"] += mapping.get("pss", 0) / 1024
        if kind == "arena":
            arenas.append(round(mapping.get("rss", 0) / 1024, 1))
    return {**{k: round(v, 1) for k, v in out.items()}, "arenas": len(arenas), "arena MiB each": sorted(arenas)}


def diff(before: list[dict], after: list[dict]) -> list[tuple]:
    """(change MiB, start, kind, before MiB, after MiB) of each mapping whose resident size changed."""
    old = {m["start"]: m for m in before}
    new = {m["start"]: m for m in after}
    rows = []
    for start in set(old) | set(new):
        a, b = old.get(start, {}), new.get(start, {})
        change = (b.get("rss", 0) - a.get("rss", 0)) / 1024
        if abs(change) >= 0.1:
            rows.append(
                (
                    round(change, 1),
                    hex(start),
                    kind_of(b or a),
                    round(a.get("rss", 0) / 1024, 1),
                    round(b.get("rss", 0) / 1024, 1),
                    (b or a)["name"],
                )
            )
    return sorted(rows, reverse=True)
