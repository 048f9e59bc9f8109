"""A memory pool the whole stack runs in: a Linux memory cgroup (v1 or v2).

On a DGX Spark, GH200 or Jetson Thor the pool is the unified memory itself. Elsewhere a memory cgroup
is a faithful stand-in: every process in it shares one limit, and the page cache of the files they read
is charged to it, as on a GB10. Reading a pool needs nothing special; making one needs root (or a
delegated cgroup) and a memory controller, and when that is missing the error says so plainly.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# cgroup v1 reports "no limit" as a page-rounded 2**63 - 1.
UNLIMITED = 2**62


def host_meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes (MemTotal, MemAvailable, MemFree, Cached, ...): the host's side of the pool."""
    info = {}
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            key, _, value = line.partition(":")
            fields = value.split()
            if fields and fields[0].isdigit():
                info[key] = int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return info


class PoolUnavailable(RuntimeError):
    """A memory pool cannot be made here; the message says why and what to do."""


@dataclass(frozen=True)
class MemoryCgroup:
    path: Path
    version: int  # 1 or 2

    def _read(self, v1_name: str, v2_name: str) -> str:
        return (self.path / (v1_name if self.version == 1 else v2_name)).read_text().strip()

    def limit_bytes(self) -> int | None:
        raw = self._read("memory.limit_in_bytes", "memory.max")
        if raw == "max" or int(raw) >= UNLIMITED:
            return None
        return int(raw)

    def limit_bytes_or_max(self) -> int:
        return self.limit_bytes() or UNLIMITED

    def usage_bytes(self) -> int:
        return int(self._read("memory.usage_in_bytes", "memory.current"))

    def peak_bytes(self) -> int | None:
        """Highest usage since the cgroup was made (page cache included); None where the kernel has no
        counter (cgroup v2 before Linux 5.19)."""
        try:
            return int(self._read("memory.max_usage_in_bytes", "memory.peak"))
        except (OSError, ValueError):
            return None

    def stat(self) -> dict[str, int]:
        stats = {}
        for line in (self.path / "memory.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if value.strip().isdigit():
                stats[key] = int(value)
        return stats

    def reclaimable_bytes(self) -> int:
        """Clean page cache the kernel takes back before it would OOM (inactive file pages)."""
        stats = self.stat()
        return stats.get("total_inactive_file", stats.get("inactive_file", 0))

    def page_cache_bytes(self) -> int:
        stats = self.stat()
        return stats.get("total_cache", stats.get("file", stats.get("cache", 0)))

    def in_use_bytes(self) -> int:
        """What the pool cannot give back without killing something: usage minus reclaimable cache."""
        return max(0, self.usage_bytes() - self.reclaimable_bytes())

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        return [int(p) for p in (self.path / "cgroup.procs").read_text().split()]


def _own_memory_path(proc_cgroup: str) -> tuple[str, int] | None:
    """(path inside the hierarchy, version) of the memory cgroup a /proc/<pid>/cgroup text names."""
    v2_path = None
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path, 1
        if controllers == "":
            v2_path = path
    if v2_path is not None and (CGROUP_ROOT / "cgroup.controllers").exists():
        return v2_path, 2
    return None


def own_cgroup(pid: int | str = "self") -> MemoryCgroup | None:
    """The memory cgroup a process is in, or None when no memory controller is mounted."""
    try:
        found = _own_memory_path(Path(f"/proc/{pid}/cgroup").read_text())
    except OSError:
        return None
    if found is None:
        return None
    path, version = found
    base = CGROUP_ROOT / "memory" if version == 1 else CGROUP_ROOT
    full = base / path.lstrip("/")
    return MemoryCgroup(full, version) if full.exists() else None


def effective_limit_bytes(cgroup: MemoryCgroup | None = None) -> int | None:
    """The tightest limit over a cgroup and its ancestors (a parent's limit binds its children)."""
    cgroup = cgroup or own_cgroup()
    if cgroup is None:
        return None
    limits = []
    root = CGROUP_ROOT / "memory" if cgroup.version == 1 else CGROUP_ROOT
    path = cgroup.path
    while True:
        try:
            limit = MemoryCgroup(path, cgroup.version).limit_bytes()
        except (OSError, ValueError):
            limit = None
        if limit is not None:
            limits.append(limit)
        if path == root or root not in path.parents:
            break
        path = path.parent
    return min(limits) if limits else None


def create_pool(name: str, limit_bytes: int) -> MemoryCgroup:
    """A new memory cgroup of `limit_bytes` below this process's own (so outer limits still bind)."""
    parent = own_cgroup()
    if parent is None:
        raise PoolUnavailable(
            "no memory cgroup controller is mounted (neither /sys/fs/cgroup/memory for v1 "
            "nor a 'memory' entry in /sys/fs/cgroup/cgroup.controllers for v2); run without "
            "POOL=, or on a machine whose kernel has the memory controller"
        )
    if parent.version == 2:
        enabled = (parent.path / "cgroup.subtree_control").read_text().split()
        if "memory" not in enabled:
            try:
                (parent.path / "cgroup.subtree_control").write_text("+memory")
            except OSError as exc:
                raise PoolUnavailable(
                    f"cgroup v2: cannot enable the memory controller below {parent.path} ({exc.strerror}); "
                    "start inside a delegated scope instead, e.g. `systemd-run --user --scope -p MemoryMax=6G "
                    "make serve`"
                ) from exc
    path = parent.path / name
    try:
        path.mkdir(exist_ok=True)
        limit_file = "memory.limit_in_bytes" if parent.version == 1 else "memory.max"
        if parent.version == 1:
            # Swap must not stretch the pool: memsw (when the kernel accounts it) gets the same limit.
            # The kernel keeps memory <= memsw, so raise memsw first when growing, lower it last when shrinking.
            memsw = path / "memory.memsw.limit_in_bytes"
            try:
                current = MemoryCgroup(path, 1).limit_bytes_or_max()
            except (OSError, ValueError):
                current = UNLIMITED
            files = [limit_file, memsw.name] if limit_bytes <= current else [memsw.name, limit_file]
            for name in files:
                if name == limit_file or memsw.exists():
                    (path / name).write_text(str(limit_bytes))
        else:
            (path / limit_file).write_text(str(limit_bytes))
        if parent.version == 2 and (path / "memory.swap.max").exists():
            (path / "memory.swap.max").write_text("0")
    except PermissionError as exc:
        raise PoolUnavailable(
            f"cannot create a memory cgroup under {parent.path}: permission denied "
            f"(running as uid {os.getuid()}; making a pool needs root or a delegated "
            "cgroup)"
        ) from exc
    except OSError as exc:
        raise PoolUnavailable(f"cannot create a memory cgroup at {path}: {exc.strerror}") from exc
    return MemoryCgroup(path, parent.version)


def remove_pool(pool: MemoryCgroup, back_to: MemoryCgroup | None, log=None) -> None:
    """Move this process back out, end anything still in the pool (all of it is the stack's), and
    remove the then empty pool; never raises."""
    try:
        if back_to is not None and os.getpid() in pool.pids():
            back_to.add(os.getpid())
        for _ in range(20):
            left = [pid for pid in pool.pids() if pid != os.getpid()]
            if not left:
                break
            for pid in left:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)
        pool.path.rmdir()
    except OSError as exc:
        if log:
            log(f"could not remove the memory pool {pool.path}: {exc}")


def limited_cgroup(cgroup: MemoryCgroup | None = None) -> MemoryCgroup | None:
    """The nearest cgroup (this process's own or an ancestor) that has a memory limit: the pool."""
    cgroup = cgroup or own_cgroup()
    while cgroup is not None:
        try:
            limit = cgroup.limit_bytes()
        except (OSError, ValueError):  # the v2 root (or a cgroup without the memory controller) has no memory.max
            limit = None
        if limit is not None:
            return cgroup
        parent = cgroup.path.parent
        if not (parent / "cgroup.procs").exists():
            return None
        cgroup = MemoryCgroup(parent, cgroup.version)
    return None
