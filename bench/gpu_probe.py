"""What a GPU holds, read without a CUDA context (NVML), and what vLLM said about it (its log lines).

Pure readers for bench/bench_gpu_plan.py: NVML samples of the device and its processes, the role of a
process from its title, and the memory lines vLLM 0.26-0.32 log at start (vllm/v1/worker/gpu_worker.py,
gpu_model_runner.py, v1/core/kv_cache_utils.py, utils/mem_utils.py).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

GIB = 2**30
# The worker's memory lines, as vLLM logs them; values in GiB unless the name says tokens.
LOG_PATTERNS = {
    "weights_gib": re.compile(r"Model loading took ([\d.]+) GiB"),
    "available_kv_gib": re.compile(r"Available KV cache memory: ([\d.]+) GiB"),
    "kv_tokens": re.compile(r"GPU KV cache size: ([\d,]+) tokens"),
    "max_concurrency": re.compile(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"),
    "cuda_graph_gib": re.compile(r"Graph capturing finished in \d+ secs, took ([\d.]+) GiB"),
    "torch_peak_increase_gib": re.compile(r"torch peak memory increase: ([\d.]+) ?GiB"),
    "non_torch_increase_gib": re.compile(r"non-torch forward increase memory: ([\d.]+) ?GiB"),
    "non_kv_cache_gib": re.compile(r"Total non KV cache memory: ([\d.]+) ?GiB"),
    "initial_free_gib": re.compile(r"Initial free memory: ([\d.]+) GiB"),
    "attention_block_tokens": re.compile(r"Setting attention block size to (\d+) tokens"),
    "padding_layers": re.compile(r"Add (\d+) padding layers"),
    "refused": re.compile(r"(Free memory on device .* is less than desired GPU memory utilization.*)"),
}
# vLLM's logging config for the measured engines: INFO everywhere, DEBUG for the worker's memory lines.
VLLM_LOGGING_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"}},
    "handlers": {
        "vllm": {"class": "logging.StreamHandler", "formatter": "plain", "level": "DEBUG", "stream": "ext://sys.stdout"}
    },
    "loggers": {
        "vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": False},
        "vllm.v1.worker.gpu_worker": {"level": "DEBUG"},
    },
}


def parse_vllm_log(text: str) -> dict:
    """The memory lines of one process's log (the first match of each; `refused` keeps its message)."""
    found: dict = {}
    for name, pattern in LOG_PATTERNS.items():
        match = pattern.search(text)
        if not match:
            continue
        value = match.group(1)
        found[name] = value if name == "refused" else float(value.replace(",", ""))
    for name in ("kv_tokens", "attention_block_tokens", "padding_layers"):
        if name in found:
            found[name] = int(found[name])
    return found


def vllm_logs_by_pid(log_dir: Path) -> dict[int, dict]:
    """Ray writes each worker's output to worker-<id>-<job>-<pid>.out/.err: the memory lines per pid."""
    logs: dict[int, str] = {}
    for path in sorted(log_dir.rglob("worker-*")):
        match = re.search(r"-(\d+)\.(out|err)$", path.name)
        if match:
            logs[int(match.group(1))] = logs.get(int(match.group(1)), "") + path.read_text(errors="replace")
    return {pid: lines for pid, lines in ((p, parse_vllm_log(t)) for p, t in logs.items()) if lines}


# HBM bandwidth by NVML's device name, the decode roofline's denominator (NVIDIA's data sheets: H100 SXM5
# 80GB HBM3 3.35 TB/s, H200 141GB HBM3e 4.8 TB/s).
HBM_BYTES_PER_S = {"H100 80GB HBM3": 3.35e12, "H200": 4.8e12}


def hbm_bandwidth(device_name: str) -> float | None:
    """The card's HBM bandwidth in bytes/s, or None for a card not in the table."""
    return next((bw for needle, bw in HBM_BYTES_PER_S.items() if needle in device_name), None)


def decode_roofline(weight_bytes: int, device_name: str) -> float | None:
    """Single-stream decode's ceiling in tokens/s: every step reads every weight once from HBM."""
    bandwidth = hbm_bandwidth(device_name)
    return bandwidth / weight_bytes if bandwidth and weight_bytes else None


def role_of(title: str) -> str:
    """A process's part in the stack from its title (Ray sets `ray::<Class>...` on its workers)."""
    # vLLM 0.26 titles its Ray worker `ray::RayWorkerProc.run`; earlier versions `RayWorkerWrapper`.
    for needle, role in (
        ("RayWorkerProc", "vllm_worker"),
        ("RayWorkerWrapper", "vllm_worker"),
        ("EngineCore", "engine_core"),
        ("PoolserveLLMServer", "chat_replica"),
        ("embedder", "embedder"),
        ("retriever", "retriever"),
        ("gateway", "gateway"),
        ("api_server", "raw_vllm"),
    ):
        if needle in title:
            return role
    return "other"


@dataclass
class GpuSample:
    t: float
    used: int
    free: int
    processes: dict[int, int]


@dataclass
class GpuSampler:
    """NVML samples of GPU 0 every interval_s in a thread, until stop()."""

    interval_s: float = 1.0
    samples: list[GpuSample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def read(self) -> GpuSample:
        import pynvml

        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        info = pynvml.nvmlDeviceGetMemoryInfo(handle)
        procs = {p.pid: int(p.usedGpuMemory or 0) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        return GpuSample(time.time(), int(info.used), int(info.free), procs)

    def device_name(self) -> str:
        import pynvml

        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        return name.decode() if isinstance(name, bytes) else name

    def total(self) -> int:
        import pynvml

        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).total)

    def __enter__(self) -> GpuSampler:
        import pynvml

        pynvml.nvmlInit()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.samples.append(self.read())
            except Exception:  # a sample lost while a process exits is not a measurement error
                continue

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def first_seen(self) -> dict[int, GpuSample]:
        """Each GPU process's first sample, and the free memory just before it appeared (what the engine's
        start check saw is at most that)."""
        seen: dict[int, GpuSample] = {}
        previous = None
        for sample in self.samples:
            for pid in sample.processes:
                if pid not in seen:
                    seen[pid] = previous or sample
            previous = sample
        return seen
