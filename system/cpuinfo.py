"""What the host's CPU computes natively, read from /proc/cpuinfo (Linux)."""

from __future__ import annotations

from pathlib import Path

# x86: AVX512_BF16 (Cooper Lake, Zen 4 and later) or AMX (Sapphire Rapids and later); Arm: FEAT_BF16.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16"})


def cpu_flags(cpuinfo: str) -> set[str]:
    """The first processor's feature flags (x86 `flags`, Arm `Features`)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def cpu_has_native_bf16(cpuinfo_path: str = "/proc/cpuinfo") -> bool:
    """False where bfloat16 is emulated: torch's bf16 GEMMs and vLLM's CPU attention then run several
    times slower than float32 (docs/BENCHMARKS.md section 1.2)."""
    try:
        text = Path(cpuinfo_path).read_text()
    except OSError:
        return False
    return bool(cpu_flags(text) & NATIVE_BF16_FLAGS)
