"""Level-1 sleep's host copy of the weights at their exact size, pinned once and reused by every later sleep.

vLLM's CuMemAllocator.sleep (vllm/device_allocator/cumem.py, 0.26) copies each weight allocation into
`torch.empty(size, pin_memory=True)`. torch's pinned allocator rounds every request up to a power of two
(ATen's CachingHostAllocator: `PowerOf2Ceil(size)`) and keeps the blocks cached after the wake drops the
tensors (vllm#16663): an engine that slept once holds about 1.5x its weights on the host from then on. On an H200
machine with 125 GiB of host memory two 27B engines, each planned at 50.1 GiB of level-1 weights, died at the
second sleep (2026-12-07, docs/GPU.md). Installed in a Worker, sleep copies each allocation into its own anonymous
mapping of the exact size (page-aligned, so no two share a page), pinned once with cudaHostRegister and reused by
every sleep, so a swap pays only the copies both ways, as with vLLM's cached blocks. The copies are mapped and
pinned right after the engine starts (prepare_host_copies), not at its first sleep: on the H100 that first sleep
took 16-18 s for a 27B's 50.14 GiB (the pages faulted in and pinned) and made the first swap away from each engine
19 s against 2.4 s for every later one (2026-12-07, docs/GPU.md). So the host holds the weights' bytes from the
engine's start on, which is what the plan counts for it (`Plan.on_demand.asleep_host_bytes_most` holds every
level-1 engine's copies at once).
"""

from __future__ import annotations

import gc
import logging
import mmap
from types import ModuleType
from typing import Any

logger = logging.getLogger("poolserve.sleep_backups")
INSTALLED = "_poolserve_exact_backups"  # set on the allocator once installed: installing twice is a no-op
COPIES = "_poolserve_host_copies"  # on the allocator: device pointer -> its PinnedHostCopy, kept between sleeps
HELD_REPORTED = "_poolserve_held_reported"  # set on the allocator once its first sleep said what stays on the device
LEVEL_1_KEPT_TAGS = ("weights",)  # what vLLM's Worker.sleep(level=1) asks its allocator to keep on the host
# What the wrapped sleep uses of vLLM's cumem module and of its allocator (vLLM 0.26): checked before installing.
CUMEM_NAMES = ("libcudart", "unmap_and_release", "CuMemAllocator")
ALLOCATOR_NAMES = ("pointer_to_data", "sleep")


class HostRegisterError(RuntimeError):
    """cudaHostRegister or cudaHostUnregister returned an error."""


def _check(result, call: str) -> None:
    code = result[0] if isinstance(result, tuple) else result
    if int(code) != 0:
        raise HostRegisterError(f"{call} returned {code}")


class PinnedHostCopy:
    """One allocation's host copy: an anonymous mapping of its exact size (rounded to pages), pinned."""

    def __init__(self, size: int, cudart: Any):
        import torch

        self._cudart = cudart
        # private anonymous pages (mmap's default for -1 is shared memory, which a cgroup counts as shmem)
        self._mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.tensor = torch.frombuffer(self._mapping, dtype=torch.uint8, count=size)
        self.ptr = self.tensor.data_ptr()
        try:
            _check(cudart.cudaHostRegister(self.ptr, size, 0), "cudaHostRegister")
        except HostRegisterError:
            self.tensor = None
            self._mapping.close()
            raise

    @property
    def size(self) -> int:
        return self.tensor.numel()

    def free(self) -> None:
        """Unpin and unmap: the pages go back to the host at once."""
        _check(self._cudart.cudaHostUnregister(self.ptr), "cudaHostUnregister")
        self.tensor = None
        self._mapping.close()


def install_exact_backups(allocator: Any, cumem: ModuleType, cudart: Any) -> bool:
    """Replace `allocator`'s sleep (a CuMemAllocator; `cumem` its module, `cudart` torch.cuda.cudart()); its
    wake_up, vLLM's, copies back from the same tensors. False, and vLLM's sleep left as it is, where they are not
    what this was written for."""
    if getattr(allocator, INSTALLED, False):
        return True
    missing = [n for n in CUMEM_NAMES if not hasattr(cumem, n)] + [
        n for n in ALLOCATOR_NAMES if not hasattr(allocator, n)
    ]
    if missing:
        logger.warning("vLLM's CuMemAllocator lacks %s: its own sleep is left as it is", ", ".join(missing))
        return False
    copies: dict[int, PinnedHostCopy] = {}  # device pointer -> its host copy, kept for the next sleep
    setattr(allocator, COPIES, copies)

    def sleep(offload_tags: tuple[str, ...] | str | None = None) -> None:
        """vLLM's CuMemAllocator.sleep (0.26; 0.32's skips what is asleep already, as this does), with each kept
        allocation copied into a PinnedHostCopy."""
        if offload_tags is None:
            offload_tags = (cumem.CuMemAllocator.default_tag,)
        elif isinstance(offload_tags, str):
            offload_tags = (offload_tags,)
        for gone in [ptr for ptr in copies if ptr not in allocator.pointer_to_data]:  # freed since its copy was made
            copies.pop(gone).free()
        kept = dropped = 0
        for ptr, data in allocator.pointer_to_data.items():
            if data.is_asleep:  # asleep already (a second sleep): its device memory is gone, nothing to copy
                continue
            handle = data.handle
            if data.tag in offload_tags:
                size = handle[1]
                copy = _copy_for(copies, ptr, size, cudart)
                cumem.libcudart.cudaMemcpy(copy.ptr, ptr, size)
                data.cpu_backup_tensor = copy.tensor
                kept += size
            else:
                dropped += handle[1]
            try:
                cumem.unmap_and_release(handle)
            finally:
                data.is_asleep = True
        logger.info(
            "asleep: %.2f GiB kept on the host at its exact size, %.2f GiB dropped", kept / 2**30, dropped / 2**30
        )
        gc.collect()
        _empty_device_cache()
        if not getattr(allocator, HELD_REPORTED, False):  # once: the snapshot lists every segment of the engine
            setattr(allocator, HELD_REPORTED, True)
            try:
                _log_held_outside_sleep_pool(allocator)
            except Exception:  # a diagnostic: the engine sleeps whether or not torch can describe its memory
                logger.warning("what torch holds outside the sleep pool could not be read", exc_info=True)

    allocator.sleep = sleep  # vLLM's wake_up maps each allocation again and copies its host copy back
    setattr(allocator, INSTALLED, True)
    return True


def _copy_for(copies: dict[int, PinnedHostCopy], ptr: int, size: int, cudart: Any) -> PinnedHostCopy:
    """The allocation's host copy: the one kept from before, or a new one (its first, or one of another size)."""
    copy = copies.get(ptr)
    if copy is None or copy.size != size:
        if copy is not None:
            copy.free()
        copy = copies[ptr] = PinnedHostCopy(size, cudart)
    return copy


def prepare_host_copies(allocator: Any, cudart: Any, tags: tuple[str, ...] = LEVEL_1_KEPT_TAGS) -> int:
    """Map and pin now, on an idle engine just started, the host copies of its allocations tagged `tags` that its
    first level-1 sleep would otherwise make. Returns the bytes pinned. If one cannot be pinned, those made here
    are freed again (the sleep then makes them, and says so if it cannot) and the error is raised."""
    copies: dict[int, PinnedHostCopy] = getattr(allocator, COPIES)
    made: list[int] = []
    try:
        for ptr, data in list(allocator.pointer_to_data.items()):
            if data.tag in tags and not data.is_asleep and ptr not in copies:
                _copy_for(copies, ptr, data.handle[1], cudart)
                made.append(ptr)
    except BaseException:
        for ptr in made:
            copies.pop(ptr).free()
        raise
    return sum(copies[ptr].size for ptr in made)


def held_outside_sleep_pool(pointer_to_data: dict, segments: list[dict], largest: int = 5) -> dict:
    """What torch's caching allocator still holds on the device that a sleep does not free: its segments
    (torch.cuda.memory_snapshot()) that are not the sleep allocator's (`pointer_to_data`, one allocation per
    segment), by memory pool (the default pool is (0, 0); a CUDA graph's has its own id), with the largest. An
    engine's device memory asleep beyond these (NVML's per process) is outside torch: its CUDA context, cuBLAS,
    NCCL, the kernels' modules."""
    outside = [s for s in segments if s["address"] not in pointer_to_data]
    by_pool: dict[str, int] = {}
    for segment in outside:
        pool = str(tuple(segment.get("segment_pool_id") or (0, 0)))
        by_pool[pool] = by_pool.get(pool, 0) + segment["total_size"]
    biggest = sorted(outside, key=lambda s: s["total_size"], reverse=True)[:largest]
    return {
        "segments": len(outside),
        "bytes": sum(s["total_size"] for s in outside),
        "allocated_bytes": sum(s.get("allocated_size", 0) for s in outside),
        "by_pool": by_pool,
        "largest": [(s["total_size"], s.get("allocated_size", 0)) for s in biggest],
        "live_in_largest": _live_blocks(biggest[0]) if biggest else [],
    }


def _live_blocks(segment: dict, most: int = 8) -> list[int]:
    """The sizes of the blocks still allocated in a segment, largest first: what keeps `empty_cache` from giving a
    nearly empty segment back (the H100's started engine: 8 MiB live in a 2,426 MiB segment, 2026-12-07)."""
    live = [b["size"] for b in segment.get("blocks", []) if b.get("state") == "active_allocated"]
    return sorted(live, reverse=True)[:most]


def _log_held_outside_sleep_pool(allocator: Any) -> None:
    """Issue 48: an engine started with the stack held ~2 GiB more asleep than one woken cold (H100, 27B and its
    4-layer cut alike); this line says whether torch holds it, and in which pool."""
    import torch

    if not torch.cuda.is_available():
        return
    held = held_outside_sleep_pool(allocator.pointer_to_data, torch.cuda.memory_snapshot())
    free, total = torch.cuda.mem_get_info()
    logger.info(
        "asleep, held by torch outside the sleep pool: %.3f GiB in %d segments (%.3f GiB allocated), by pool %s, "
        "largest %s (MiB, allocated MiB), the blocks live in the largest %s (bytes); the device's free memory "
        "%.2f of %.2f GiB",
        held["bytes"] / 2**30,
        held["segments"],
        held["allocated_bytes"] / 2**30,
        {pool: round(size / 2**30, 3) for pool, size in held["by_pool"].items()},
        [(round(size / 2**20), round(used / 2**20)) for size, used in held["largest"]],
        held["live_in_largest"],
        free / 2**30,
        total / 2**30,
    )


def _empty_device_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def install_in_this_worker() -> bool:
    """In a vLLM Worker on a CUDA device: exact host copies for its CuMemAllocator's level-1 sleep, pinned now."""
    import time

    import torch
    from vllm.device_allocator import cumem

    if not getattr(cumem, "cumem_available", False):
        return False
    allocator, cudart = cumem.CuMemAllocator.get_instance(), torch.cuda.cudart()
    if not install_exact_backups(allocator, cumem, cudart):
        return False
    started = time.monotonic()
    pinned = prepare_host_copies(allocator, cudart)
    logger.info(
        "level-1 host copies pinned ahead of the first sleep: %.2f GiB in %.1f s",
        pinned / 2**30,
        time.monotonic() - started,
    )
    return True
