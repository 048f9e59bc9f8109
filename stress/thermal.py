"""Layer 6's sensors: NVML where a GPU is (temperature, SM clock, throttle reasons), else Linux's
cpufreq and thermal zones; None where the machine exposes neither. Reading never changes anything."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from stress.measure import sustained_drop

# NVML clock-event reasons that mean the chip slowed itself down (not idle, not an application cap).
NVML_SLOWDOWN_BITS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
}


def nvml_reader() -> tuple[Callable[[], dict] | None, str]:
    """A reader of every GPU's temperature (C), SM clock (MHz) and slowdown-reason bits, or why not."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError as exc:
        return None, f"NVML: {exc}"
    if not handles:
        return None, "NVML sees no GPU"

    def read() -> dict:
        values = {}
        for i, handle in enumerate(handles):
            values[f"gpu{i}_temp_c"] = float(pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
            values[f"gpu{i}_sm_mhz"] = float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
            values[f"gpu{i}_slowdown_bits"] = int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
        return values

    return read, f"NVML, {len(handles)} GPU(s)"


def sysfs_reader(root: Path = Path("/sys")) -> tuple[Callable[[], dict] | None, str]:
    """A reader of each CPU's current frequency (MHz) and each thermal zone's temperature (C), or why not."""
    freqs = sorted((root / "devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_cur_freq"))
    zones = sorted((root / "class/thermal").glob("thermal_zone*/temp"))
    if not freqs and not zones:
        return None, f"no {root}/devices/system/cpu/*/cpufreq and no {root}/class/thermal zones"

    def read() -> dict:
        values = {}
        for path in freqs:
            values[f"{path.parent.parent.name}_mhz"] = int(path.read_text()) / 1000  # kHz
        for path in zones:
            values[f"{path.parent.name}_temp_c"] = int(path.read_text()) / 1000  # millidegrees
        return values

    return read, f"sysfs: {len(freqs)} cpufreq, {len(zones)} thermal zones"


def find_reader() -> tuple[Callable[[], dict] | None, str]:
    """NVML first (a GPU machine), then sysfs; the reasons neither works otherwise."""
    reader, nvml_note = nvml_reader()
    if reader:
        return reader, nvml_note
    reader, sysfs_note = sysfs_reader()
    return reader, sysfs_note if reader else f"{nvml_note}; {sysfs_note}"


def judge(
    samples: list[tuple[float, dict]], drop_fraction: float, drop_seconds: float, max_temperature_c: float | None
) -> tuple[dict, list[tuple[str, bool, str]]]:
    """Figures and (check, ok, detail) from timed sensor samples: a clock below (1 - drop_fraction) of its
    first readings for drop_seconds or longer fails; so does a temperature above max_temperature_c."""
    keys = sorted({key for _, values in samples for key in values})
    figures: dict[str, dict] = {}
    checks = []
    for key in keys:
        series = [(t, values[key]) for t, values in samples if key in values]
        if key.endswith("_mhz"):
            drop = sustained_drop(series, drop_fraction, drop_seconds)
            figures[key] = {"samples": len(series), **drop}
            checks.append(
                (
                    f"{key} no sustained drop",
                    not drop["sustained"],
                    f"longest {drop['longest_drop_s']} s below {1 - drop_fraction:.0%} of {drop['reference']}",
                )
            )
        elif key.endswith("_temp_c"):
            peak = max(v for _, v in series)
            figures[key] = {"samples": len(series), "first": series[0][1], "max": peak}
            if max_temperature_c is not None:
                checks.append((f"{key} <= {max_temperature_c} C", peak <= max_temperature_c, f"max {peak} C"))
        elif key.endswith("_slowdown_bits"):
            seen = {name for _, bits in series for bit, name in NVML_SLOWDOWN_BITS.items() if int(bits) & bit}
            slowed = sum(1 for _, bits in series if any(int(bits) & bit for bit in NVML_SLOWDOWN_BITS))
            figures[key] = {"samples": len(series), "slowed_samples": slowed, "reasons": sorted(seen)}
    return figures, checks
