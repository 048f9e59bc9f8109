"""Cold start: `make serve` on a fresh clone, to healthy and to the first streamed token.

Two cases, each a fresh `git clone` of this checkout's HEAD:
- installed: the clone's .venv is a link to an existing, installed virtual environment (the Makefile skips
  the install when its stamp is there; PYTHONPATH points at the clone, since that venv's editable install
  points at its own checkout); it still prepares its own models (GGUF -> HF conversion) and starts;
- fresh: the clone makes its own venv and installs every pinned package (pip's cache as this machine has
  it; a machine with an empty cache also downloads them), then prepares models and starts.

Each phase is timed from the `make serve` start: setup done (the make recipe's own steps are timed by the
stamp/model files appearing), healthy (GET /healthz answers 200), first token (a streamed chat completion's
first content chunk). The stack is stopped (SIGTERM to make's process group; the launcher ends its own
processes) and the clone removed.

    .venv/bin/python bench/bench_cold_start.py                    # both cases
    .venv/bin/python bench/bench_cold_start.py --cases installed

Writes bench/results/cold-start.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench.harness.procs import ProcessGroup, free_port  # noqa: E402
from bench.harness.results import RESULTS_DIR, BenchResult, new_result, write_result  # noqa: E402
from stackctl.launcher import StackLayout, down  # noqa: E402
from tenancy.keys import generate_api_key  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NAME = "cold-start"
POLL_S = 1.0
TIMEOUT_S = {"installed": 900.0, "fresh": 2400.0}


def _first_token_s(base_url: str, api_key: str, model: str) -> float:
    """Seconds to the first content chunk of a streamed chat completion."""
    started = time.monotonic()
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
        "stream": True,
        "temperature": 0,
    }
    with httpx.stream(
        "POST",
        f"{base_url}/v1/chat/completions",
        json=body,
        timeout=120,
        headers={"Authorization": f"Bearer {api_key}"},
    ) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                return time.monotonic() - started
    raise RuntimeError("the stream ended without a token")


def cold_start(case: str, venv: Path | None, workdir: Path) -> dict:
    clone = workdir / f"clone-{case}"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=300)
    port = free_port()
    profile = yaml.safe_load((clone / "configs" / "cpu-tiny.yaml").read_text())
    profile["gateway"] = {**profile.get("gateway", {}), "port": port}
    (clone / "bench-profile.yaml").write_text(yaml.safe_dump(profile))
    api_key = generate_api_key()
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update({"POOLSERVE_DEMO_KEY": api_key, "RAY_USAGE_STATS_ENABLED": "0"})
    if venv:
        (clone / ".venv").symlink_to(venv)
        env["PYTHONPATH"] = str(clone)
    command = ["make", "serve", "PROFILE=bench-profile.yaml"]
    venv_dir = clone / ".venv"
    base_url = f"http://127.0.0.1:{port}"
    group = ProcessGroup.start(command, env, workdir / f"{case}.log", cwd=clone)
    started = time.monotonic()
    marks: dict[str, float] = {}
    try:
        deadline = started + TIMEOUT_S[case]
        while time.monotonic() < deadline and "healthy_s" not in marks:
            if not group.running():
                raise RuntimeError(f"make serve exited ({group.process.returncode}):\n{group.log_tail()}")
            if "installed_s" not in marks and (venv_dir / ".poolserve-installed-cpu").exists():
                marks["installed_s"] = time.monotonic() - started
            if (
                "models_s" not in marks
                and (clone / "models" / "all-MiniLM-L6-v2").exists()
                and (clone / "models" / "SmolLM2-135M-Instruct" / "config.json").exists()
            ):
                marks["models_s"] = time.monotonic() - started
            try:
                if httpx.get(f"{base_url}/healthz", timeout=5).status_code == 200:
                    marks["healthy_s"] = time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(POLL_S)
        if "healthy_s" not in marks:
            raise RuntimeError(f"not healthy after {TIMEOUT_S[case]:.0f}s:\n{group.log_tail()}")
        marks["first_token_s"] = marks["healthy_s"] + _first_token_s(base_url, api_key, profile["chat"]["model_id"])
    finally:
        group.stop(grace_s=120)
        down(StackLayout(clone / profile.get("state_dir", "var")), log=lambda message: None)
        shutil.rmtree(clone, ignore_errors=True)
    return {
        "case": case,
        "venv": "existing, installed" if venv else "new (make installs it)",
        **{key: round(value, 1) for key, value in marks.items()},
    }


def tables(result: BenchResult) -> str:
    lines = [
        "| case | venv | packages installed s | models prepared s | healthy s | first token s |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in result.rows:
        lines.append(
            f"| {row['case']} | {row['venv']} | {row.get('installed_s', '-')} | {row.get('models_s', '-')} "
            f"| {row['healthy_s']} | {row['first_token_s']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=lambda s: s.split(","), default=["installed", "fresh"])
    parser.add_argument("--venv", type=Path, default=ROOT / ".venv", help="the installed venv of the 'installed' case")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-cold-start-"))
    rows = [cold_start(case, args.venv.resolve() if case == "installed" else None, workdir) for case in args.cases]
    result = new_result(
        NAME,
        {"cases": args.cases, "profile": "configs/cpu-tiny.yaml (own port)", "installed_venv": str(args.venv)},
        {},
        rows,
    )
    print(tables(result))
    print(f"wrote {write_result(result, args.out_dir)} (logs in {workdir})")


if __name__ == "__main__":
    main()
