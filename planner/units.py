"""Byte units and formatting shared by the planner modules (constants only, no state)."""

from __future__ import annotations

KiB = 2**10
MiB = 2**20
GiB = 2**30
MB = 10**6
GB = 10**9


def gib(n: int | float) -> str:
    """12345678901 -> '11.50 GiB' (sizes below 1 GiB are shown in MiB)."""
    if abs(n) < GiB:
        return f"{n / MiB:.1f} MiB"
    return f"{n / GiB:.2f} GiB"


def cdiv(a: int, b: int) -> int:
    return -(-a // b)
