"""The memory pool as a cgroup: parsing /proc/<pid>/cgroup, reading a cgroup, and making a real one."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from system import cgroup
from system.cgroup import MemoryCgroup, PoolUnavailable

MiB = 2**20
GiB = 2**30
V1_UNLIMITED = "9223372036854771712"  # what v1 reports for "no limit" (2**63 - 1, page-rounded)


def _write(directory: Path, files: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


def _v1_dir(directory: Path, limit: str, usage: int = 0, inactive_file: int = 0, cache: int = 0) -> Path:
    # A v1 memory.stat holds both the cgroup's own counters and the hierarchical total_* ones.
    stat = (
        f"cache {cache // 2}\nrss 1000\ninactive_file {inactive_file // 2}\n"
        f"hierarchical_memory_limit {V1_UNLIMITED}\n"
        f"total_cache {cache}\ntotal_rss 2000\ntotal_inactive_file {inactive_file}\n"
    )
    return _write(
        directory,
        {
            "memory.limit_in_bytes": f"{limit}\n",
            "memory.usage_in_bytes": f"{usage}\n",
            "memory.stat": stat,
            "cgroup.procs": "",
        },
    )


def _v2_dir(directory: Path, limit: str, usage: int = 0, inactive_file: int = 0, file: int = 0) -> Path:
    stat = f"anon 4096\nfile {file}\nkernel 8192\nactive_file 0\ninactive_file {inactive_file}\n"
    return _write(
        directory, {"memory.max": f"{limit}\n", "memory.current": f"{usage}\n", "memory.stat": stat, "cgroup.procs": ""}
    )


# --- _own_memory_path -------------------------------------------------------------------------------


def test_own_memory_path_v1(monkeypatch, tmp_path):
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", tmp_path)
    assert cgroup._own_memory_path("4:memory:/a/b") == ("/a/b", 1)
    # A full hybrid-host text: the v1 memory line wins over the v2 "0::" line, in either order.
    hybrid = "9:name=systemd:/\n5:cpu,cpuacct:/\n4:memory:/process_api/x\n0::/\n"
    assert cgroup._own_memory_path(hybrid) == ("/process_api/x", 1)
    assert cgroup._own_memory_path("0::/\n4:memory:/late\n") == ("/late", 1)
    # memory co-mounted with another controller
    assert cgroup._own_memory_path("3:cpu,memory:/c") == ("/c", 1)


def test_own_memory_path_v2_needs_cgroup_controllers(monkeypatch, tmp_path):
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", tmp_path)
    text = "0::/user.slice/x"
    # Without a v2 mount (no cgroup.controllers) there is no memory cgroup at all.
    assert cgroup._own_memory_path(text) is None
    (tmp_path / "cgroup.controllers").write_text("cpu io memory pids\n")
    assert cgroup._own_memory_path(text) == ("/user.slice/x", 2)


def test_own_memory_path_none_without_memory_line(monkeypatch, tmp_path):
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", tmp_path)
    assert cgroup._own_memory_path("9:name=systemd:/\n8:pids:/\n1:cpu:/\n") is None
    assert cgroup._own_memory_path("") is None


# --- MemoryCgroup on a fake tree ---------------------------------------------------------------------


def test_v1_readings(tmp_path):
    path = _v1_dir(tmp_path / "pool", str(512 * MiB), usage=300 * MiB, inactive_file=100 * MiB, cache=150 * MiB)
    group = MemoryCgroup(path, 1)
    assert group.limit_bytes() == 512 * MiB
    assert group.usage_bytes() == 300 * MiB
    assert group.reclaimable_bytes() == 100 * MiB  # total_inactive_file, not the cgroup-local one
    assert group.page_cache_bytes() == 150 * MiB  # total_cache
    assert group.in_use_bytes() == 200 * MiB
    assert group.stat()["total_rss"] == 2000


def test_v1_unlimited_is_none(tmp_path):
    assert MemoryCgroup(_v1_dir(tmp_path / "a", V1_UNLIMITED), 1).limit_bytes() is None
    assert MemoryCgroup(_v1_dir(tmp_path / "b", str(2**62)), 1).limit_bytes() is None
    assert MemoryCgroup(_v1_dir(tmp_path / "c", str(2**62 - 4096)), 1).limit_bytes() == 2**62 - 4096


def test_v2_readings(tmp_path):
    path = _v2_dir(tmp_path / "pool", str(6 * GiB), usage=2 * GiB, inactive_file=GiB // 2, file=GiB)
    group = MemoryCgroup(path, 2)
    assert group.limit_bytes() == 6 * GiB
    assert group.usage_bytes() == 2 * GiB
    assert group.reclaimable_bytes() == GiB // 2
    assert group.page_cache_bytes() == GiB
    assert group.in_use_bytes() == 2 * GiB - GiB // 2


def test_v2_max_is_none(tmp_path):
    assert MemoryCgroup(_v2_dir(tmp_path / "pool", "max"), 2).limit_bytes() is None


@pytest.mark.parametrize("version", [1, 2])
def test_in_use_never_negative(tmp_path, version):
    # usage_in_bytes is batched per CPU in v1 and can lag memory.stat: reclaimable may exceed it.
    make = _v1_dir if version == 1 else _v2_dir
    group = MemoryCgroup(
        make(tmp_path / "pool", "max" if version == 2 else V1_UNLIMITED, usage=10 * MiB, inactive_file=50 * MiB),
        version,
    )
    assert group.in_use_bytes() == 0


def test_missing_stat_keys_read_as_zero(tmp_path):
    path = _write(tmp_path / "pool", {"memory.stat": "anon 1\nweird line\n", "memory.current": "7\n"})
    group = MemoryCgroup(path, 2)
    assert group.reclaimable_bytes() == 0
    assert group.page_cache_bytes() == 0
    assert group.in_use_bytes() == 7


def test_add_and_pids_use_cgroup_procs(tmp_path):
    path = _v2_dir(tmp_path / "pool", "max")
    group = MemoryCgroup(path, 2)
    assert group.pids() == []
    group.add(1234)
    assert (path / "cgroup.procs").read_text() == "1234"
    (path / "cgroup.procs").write_text("1\n22\n333\n")
    assert group.pids() == [1, 22, 333]


# --- effective_limit_bytes ---------------------------------------------------------------------------


def test_effective_limit_is_min_over_ancestors_v1(monkeypatch, tmp_path):
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", tmp_path)
    root = _v1_dir(tmp_path / "memory", V1_UNLIMITED)
    parent = _v1_dir(root / "parent", str(1 * GiB))
    middle = _write(parent / "middle", {})  # no limit file: skipped, not an error
    child = _v1_dir(middle / "child", str(4 * GiB))
    assert cgroup.effective_limit_bytes(MemoryCgroup(child, 1)) == 1 * GiB
    (child / "memory.limit_in_bytes").write_text(str(256 * MiB))
    assert cgroup.effective_limit_bytes(MemoryCgroup(child, 1)) == 256 * MiB
    # A limit on the root binds too; nothing above the root is read.
    (root / "memory.limit_in_bytes").write_text(str(128 * MiB))
    _v1_dir(tmp_path, str(1 * MiB))  # CGROUP_ROOT itself is not a v1 memory cgroup
    assert cgroup.effective_limit_bytes(MemoryCgroup(child, 1)) == 128 * MiB


def test_effective_limit_v2_and_unlimited(monkeypatch, tmp_path):
    monkeypatch.setattr(cgroup, "CGROUP_ROOT", tmp_path)
    # The v2 root has no memory.max at all; an unlimited chain has no effective limit.
    _write(tmp_path, {"cgroup.procs": ""})
    leaf = _v2_dir(_v2_dir(tmp_path / "user.slice", "max") / "leaf", "max")
    assert cgroup.effective_limit_bytes(MemoryCgroup(leaf, 2)) is None
    (tmp_path / "user.slice" / "memory.max").write_text(str(3 * GiB))
    assert cgroup.effective_limit_bytes(MemoryCgroup(leaf, 2)) == 3 * GiB


def test_effective_limit_without_cgroup(monkeypatch):
    monkeypatch.setattr(cgroup, "own_cgroup", lambda pid="self": None)
    assert cgroup.effective_limit_bytes() is None


# --- create_pool / remove_pool on fake trees (no root needed) ----------------------------------------


def test_create_pool_without_controller_raises(monkeypatch):
    monkeypatch.setattr(cgroup, "own_cgroup", lambda pid="self": None)
    with pytest.raises(PoolUnavailable, match="no memory cgroup controller"):
        cgroup.create_pool("pstest-none", 256 * MiB)


def test_create_pool_fake_v1_sets_memsw(monkeypatch, tmp_path):
    parent = _v1_dir(tmp_path / "parent", V1_UNLIMITED)
    monkeypatch.setattr(cgroup, "own_cgroup", lambda pid="self": MemoryCgroup(parent, 1))
    # A real kernel populates the new directory; here memsw exists only if we pre-create it.
    _write(parent / "pool", {"memory.memsw.limit_in_bytes": V1_UNLIMITED})
    pool = cgroup.create_pool("pool", 256 * MiB)
    assert pool == MemoryCgroup(parent / "pool", 1)
    assert (parent / "pool" / "memory.limit_in_bytes").read_text() == str(256 * MiB)
    assert (parent / "pool" / "memory.memsw.limit_in_bytes").read_text() == str(256 * MiB)


def test_create_pool_fake_v2_enables_memory(monkeypatch, tmp_path):
    parent = _write(tmp_path / "parent", {"cgroup.subtree_control": "cpu\n"})
    monkeypatch.setattr(cgroup, "own_cgroup", lambda pid="self": MemoryCgroup(parent, 2))
    pool = cgroup.create_pool("pool", 6 * GiB)
    assert pool.version == 2
    assert (parent / "cgroup.subtree_control").read_text() == "+memory"
    assert (parent / "pool" / "memory.max").read_text() == str(6 * GiB)
    assert not (parent / "pool" / "memory.swap.max").exists()  # only written when the kernel offers it


def test_create_pool_fake_v2_subtree_control_refused(monkeypatch, tmp_path):
    parent = _write(tmp_path / "parent", {"cgroup.subtree_control": "cpu\n"})
    monkeypatch.setattr(cgroup, "own_cgroup", lambda pid="self": MemoryCgroup(parent, 2))

    real_write_text = Path.write_text

    def refuse_subtree_control(self, *args, **kwargs):
        if self.name == "cgroup.subtree_control":
            raise OSError(16, "Device or resource busy")
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", refuse_subtree_control)
    with pytest.raises(PoolUnavailable, match="cgroup v2: cannot enable the memory controller"):
        cgroup.create_pool("pool", GiB)


def test_create_pool_oserror_is_pool_unavailable(monkeypatch, tmp_path):
    missing_parent = MemoryCgroup(tmp_path / "does-not-exist", 1)
    monkeypatch.setattr(cgroup, "own_cgroup", lambda pid="self": missing_parent)
    with pytest.raises(PoolUnavailable, match="cannot create a memory cgroup at"):
        cgroup.create_pool("pool", GiB)


def test_remove_pool_never_raises(tmp_path):
    cgroup.remove_pool(MemoryCgroup(tmp_path / "gone", 1), None)
    cgroup.remove_pool(MemoryCgroup(tmp_path / "gone", 1), MemoryCgroup(tmp_path / "gone-too", 1))


# --- a real v1 pool ----------------------------------------------------------------------------------

_CHILD = """
import sys, time
sys.stdin.readline()                 # wait until the test has moved us into the pool
buf = bytearray(64 << 20)
for i in range(0, len(buf), 4096):   # touch every page so it is charged
    buf[i] = 1
print("ready", flush=True)
time.sleep(60)
"""


def _real_v1_or_skip() -> MemoryCgroup:
    if os.geteuid() != 0:
        pytest.skip("making a real memory cgroup needs root")
    if not (cgroup.CGROUP_ROOT / "memory").is_dir():
        pytest.skip("no cgroup v1 memory controller at /sys/fs/cgroup/memory")
    own = cgroup.own_cgroup()
    if own is None or own.version != 1:
        pytest.skip("this process is not in a cgroup v1 memory cgroup")
    return own


def test_real_pool_limits_and_charges_a_child():
    own = _real_v1_or_skip()
    name = f"pstest-{uuid.uuid4().hex[:10]}"
    pool = None
    child = None
    try:
        pool = cgroup.create_pool(name, 256 * MiB)
        assert pool.path == own.path / name and pool.path.is_dir()
        assert pool.version == 1
        assert pool.limit_bytes() == 256 * MiB
        assert cgroup.effective_limit_bytes(pool) == 256 * MiB
        memsw = pool.path / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            assert int(memsw.read_text()) == 256 * MiB
        assert pool.pids() == []

        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        pool.add(child.pid)
        assert child.pid in pool.pids()
        assert os.getpid() not in pool.pids()
        before = pool.usage_bytes()

        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while pool.usage_bytes() < before + 48 * MiB and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool.usage_bytes() >= before + 48 * MiB, (before, pool.usage_bytes())
        assert pool.usage_bytes() <= 256 * MiB
        assert pool.in_use_bytes() >= 48 * MiB

        child.kill()
        child.wait(timeout=10)
        deadline = time.monotonic() + 5
        while pool.pids() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pool.pids() == []
        cgroup.remove_pool(pool, None)
        assert not pool.path.exists()
    finally:
        if child is not None:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=10)
            for stream in (child.stdin, child.stdout):
                stream.close()
        if pool is not None and pool.path.exists():
            deadline = time.monotonic() + 5
            while True:
                try:
                    pool.path.rmdir()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)


def test_real_own_cgroup_is_readable():
    own = _real_v1_or_skip()
    assert own.path.is_dir()
    assert os.getpid() in own.pids()
    assert own.usage_bytes() > 0
    assert 0 <= own.in_use_bytes() <= own.usage_bytes()


def test_peak_reads_the_kernels_high_water_mark(tmp_path):
    v1 = MemoryCgroup(tmp_path, 1)
    (tmp_path / "memory.max_usage_in_bytes").write_text("6699167744\n")
    assert v1.peak_bytes() == 6699167744
    v2_dir = tmp_path / "v2"
    v2_dir.mkdir()
    assert MemoryCgroup(v2_dir, 2).peak_bytes() is None  # memory.peak arrived in Linux 5.19
    (v2_dir / "memory.peak").write_text("123\n")
    assert MemoryCgroup(v2_dir, 2).peak_bytes() == 123
