"""Per-process memory series of one running stack, for a soak: anonymous and file-backed bytes, threads.

Layer 3 of `poolserve stress` reads each replica's PSS from /status; to find *what* grows under load,
this samples every process carrying the stack's marker (stackctl.processes) from /proc directly:
smaps_rollup's Pss_Anon / Pss_File / Pss_Shmem and Rss, and /proc/<pid>/status's thread count (glibc
makes up to 8 x cores malloc arenas as threads appear, and never trims arenas other than the main one).
It starts nothing and sends nothing: run it beside a load, e.g. `poolserve stress --layers 3` with a
profile whose `stress.concurrency_seconds` is 3600 (docs/STRESS.md, "The soak").

    .venv/bin/python bench/soak_memory.py --state-dir var --seconds 3900 --out bench/results/soak.jsonl
    .venv/bin/python bench/soak_memory.py --summarize bench/results/soak.jsonl --warmup-s 600 [--until-s 3600]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import psutil

from stackctl.launcher import StackLayout
from stackctl.processes import stack_pids

MIB = 1024 * 1024
# Which replica a process belongs to, from its command line (Ray's actor titles, vLLM's process names).
LABELS = (
    ("EngineCore", "chat:EngineCore"),
    ("VLLM::Worker", "chat:Worker"),
    ("PoolserveLLMServer", "chat:actor"),
    ("ServeReplica:poolserve:embedder", "embedder"),
    ("ServeReplica:poolserve:retriever", "retriever"),
    ("ServeReplica:poolserve:gateway", "gateway"),
    ("ServeController", "serve-controller"),
    ("ProxyActor", "serve-proxy"),
    ("raylet", "raylet"),
    ("gcs_server", "gcs"),
    ("dashboard", "ray-dashboard"),
)
ROLLUP_KEYS = {
    "Rss": "rss",
    "Pss_Anon": "pss_anon",
    "Pss_File": "pss_file",
    "Pss_Shmem": "pss_shmem",
    "Anonymous": "anonymous",
}


def label_of(cmdline: str) -> str:
    for fragment, label in LABELS:
        if fragment in cmdline:
            return label
    return "other:" + (cmdline.split()[0].rsplit("/", 1)[-1] if cmdline else "?")


def read_process(pid: int) -> dict | None:
    """One process's figures in bytes, or None when it is gone."""
    try:
        cmdline = " ".join(psutil.Process(pid).cmdline())
        figures = {"pid": pid, "label": label_of(cmdline)}
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                key, _, rest = line.partition(":")
                if key in ROLLUP_KEYS:
                    figures[ROLLUP_KEYS[key]] = int(rest.split()[0]) * 1024
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("Threads:"):
                    figures["threads"] = int(line.split()[1])
        return figures
    except (OSError, psutil.Error, ValueError):
        return None


def sample(stack_id: str) -> list[dict]:
    return [row for row in (read_process(pid) for pid in stack_pids(stack_id)) if row is not None]


def record(state_dir: Path, seconds: float, interval_s: float, out: Path) -> None:
    stack_id = StackLayout(state_dir).stack_id
    started = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as series:
        while time.monotonic() - started < seconds:
            tick = time.monotonic()
            rows = sample(stack_id)
            series.write(json.dumps({"t": round(tick - started, 1), "wall": time.time(), "processes": rows}) + "\n")
            series.flush()
            time.sleep(max(0.0, interval_s - (time.monotonic() - tick)))


def summarize(path: Path, warmup_s: float, until_s: float | None = None) -> list[dict]:
    """Per label (summed over its processes): the median of the first and of the last 10% of samples after
    warm-up, their difference, and the peak; all in MiB."""
    samples = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    samples = [s for s in samples if s["t"] >= warmup_s and (until_s is None or s["t"] <= until_s)]
    for s in samples:  # a series recorded before a label was known is labelled again from its command name
        for p in s["processes"]:
            if p["label"].startswith("other:"):
                p["label"] = label_of(p["label"].removeprefix("other:"))
    if len(samples) < 4:
        raise SystemExit(f"{path}: {len(samples)} samples after {warmup_s:g} s of warm-up; need 4 or more")
    labels = sorted({p["label"] for s in samples for p in s["processes"]})
    tenth = max(2, len(samples) // 10)
    rows = []
    for label in labels:
        row = {"label": label, "samples": len(samples)}
        for key in ("pss_anon", "pss_file", "rss", "threads"):
            unit = 1 if key == "threads" else MIB
            series = [sum(p.get(key, 0) for p in s["processes"] if p["label"] == label) / unit for s in samples]
            first, last = statistics.median(series[:tenth]), statistics.median(series[-tenth:])
            row[f"{key}_first"], row[f"{key}_last"] = round(first, 1), round(last, 1)
            row[f"{key}_change"] = round(last - first, 1)
            row[f"{key}_peak"] = round(max(series), 1)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--state-dir", type=Path, default=Path("var"), help="The stack's profile state_dir.")
    parser.add_argument("--seconds", type=float, default=3900.0)
    parser.add_argument("--interval-s", type=float, default=20.0)
    parser.add_argument("--out", type=Path, default=Path("bench/results/soak-memory.jsonl"))
    parser.add_argument("--summarize", type=Path, help="Print the summary of a recorded series and exit.")
    parser.add_argument(
        "--warmup-s", type=float, default=600.0, help="Samples before this are left out of the summary."
    )
    parser.add_argument(
        "--until-s",
        type=float,
        default=None,
        help="Samples after this (the load's end; the series runs on while idle) are left out.",
    )
    args = parser.parse_args()
    if args.summarize:
        print(json.dumps(summarize(args.summarize, args.warmup_s, args.until_s), indent=1))
        return
    record(args.state_dir, args.seconds, args.interval_s, args.out)


if __name__ == "__main__":
    main()
