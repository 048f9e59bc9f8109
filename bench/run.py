"""Run the benchmarks: `smoke` (a few minutes, proves the harness end to end) or `all` (every one; long).

`all` runs every benchmark with its documented settings. Results go to bench/results/ (smoke:
bench/results/smoke/) in the one JSON format of bench/harness/results.py; bench/report.py turns them
into the docs' tables and plots.

    .venv/bin/python bench/run.py smoke        # make bench-smoke
    .venv/bin/python bench/run.py all          # make bench

Each run starts and stops its own servers (a private poolserve stack, raw vLLM), one at a time, and
checks that none of its processes is left when it ends.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import typer
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench import bench_gateway, bench_limits, bench_retrieval  # noqa: E402
from bench.harness.engine import DEFAULT_PROFILE  # noqa: E402
from bench.harness.procs import ProcessGroup, child_env  # noqa: E402
from bench.harness.stack import running_stack  # noqa: E402
from bench.harness.results import RESULTS_DIR, SMOKE_DIR, BenchResult, read_result, write_result  # noqa: E402
from bench.harness.serving import ServingLoad  # noqa: E402
from bench.harness.timing import Stopwatch  # noqa: E402
from bench.report import table_for  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
# The smoke run: one short serving comparison, one small retrieval run, the limiter bench.
SMOKE_SERVING = ServingLoad(num_prompts=4, concurrency=1, input_len=128, output_len=32)
SMOKE_RETRIEVAL = {"sizes": [2000], "kinds": ["flat", "hnsw"], "n_queries": 100, "seed": 0}
SMOKE_LIMITER_ROUNDS = 2000
STEP_TIMEOUT_S = 3600  # one benchmark of `all`; the speculative ones take 10-20 minutes

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])


@dataclass(frozen=True)
class Script:
    """One benchmark of `all`: its script, arguments and the result file it writes."""

    result: str
    script: str
    args: tuple[str, ...] = ()


def full_run(profile: Path) -> list[Script]:
    preloads = "default,tcmalloc+iomp" if TCMALLOC.exists() else "default"
    return [
        Script("limits", "bench_limits.py", ("--rounds", "2000")),
        Script("retrieval", "bench_retrieval.py"),
        Script("retrieval-scale", "bench_retrieval_scale.py", ("--profile", str(profile))),
        Script("rag-latency", "rag_latency.py", ("--profile", str(profile))),
        Script("embedding", "bench_embedding.py"),
        Script("ingest", "bench_ingest.py", ("--profile", str(profile), "--chat")),
        Script("serving", "bench_gateway.py", ("--profile", str(profile), "--llama-cpp")),
        Script("cold-start", "bench_cold_start.py"),
        Script("speculative-stack", "bench_spec_stack.py", ("--profile", str(profile))),
        Script("engine-fidelity", "bench_engine_fidelity.py", ("--profile", str(profile))),
        Script("speculative-eager", "bench_speculative.py", ("--profile", str(profile), "--eager")),
        Script("speculative", "bench_speculative.py", ("--profile", str(profile), "--preloads", preloads)),
        Script("draft-agreement", "draft_agreement.py", ("--profile", str(profile))),
    ]


def leftover_children() -> list[psutil.Process]:
    """Processes this run started that are still alive (servers, engine cores, workers)."""
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
        except psutil.NoSuchProcess:
            continue
    return alive


def summary_table(title: str, timings: list[tuple[str, float, Path]]) -> Table:
    table = Table(title=title)
    table.add_column("benchmark")
    table.add_column("wall s", justify="right")
    table.add_column("result")
    for name, seconds, path in timings:
        table.add_row(name, f"{seconds:.1f}", str(path))
    return table


def show(console: Console, result: BenchResult) -> None:
    console.rule(result.name)
    console.print(table_for(result.name, result) or "(no table for this result)", markup=False, highlight=False)


def finish(console: Console, title: str, timings: list[tuple[str, float, Path]], total_s: float) -> None:
    console.print(summary_table(title, timings))
    left = leftover_children()
    if left:
        console.print(f"[red]processes left running: {[(p.pid, p.name()) for p in left]}")
        raise typer.Exit(1)
    console.print(f"{title}: {total_s:.1f} s wall, no process left running")


@app.command()
def smoke(
    profile: Path = typer.Option(DEFAULT_PROFILE, help="Profile of the stack and raw vLLM."),
    out_dir: Path = typer.Option(SMOKE_DIR, help="Where the smoke results go."),
    stack: Path | None = typer.Option(
        None,
        help="The serve.yaml of a stack already running (its profile "
        "replaces --profile): measured as it is instead of starting a private "
        "one; a tenant key for it in $POOLSERVE_BENCH_API_KEY.",
    ),
) -> None:
    """A few minutes: gateway vs raw vLLM at concurrency 1 (4 prompts), retrieval at N=2000, the limiter."""
    console = Console()
    workdir = Path(tempfile.mkdtemp(prefix="bench-smoke-"))
    running = None
    if stack is not None:
        key = os.environ.get("POOLSERVE_BENCH_API_KEY")
        if not key:
            raise typer.BadParameter(
                "needs a tenant key of that stack in $POOLSERVE_BENCH_API_KEY", param_hint="--stack"
            )
        running, profile = running_stack(stack, key)
    steps: list[tuple[str, Callable[[], BenchResult]]] = [
        ("serving", lambda: bench_gateway.run(profile, [SMOKE_SERVING], workdir, running=running)),
        ("retrieval", lambda: bench_retrieval.run(**SMOKE_RETRIEVAL)),
        ("limits", lambda: bench_limits.run(SMOKE_LIMITER_ROUNDS)),
    ]
    timings = []
    with Stopwatch() as total:
        for name, step in steps:
            console.rule(f"smoke: {name}")
            with Stopwatch() as watch:
                result = step()
            path = write_result(result, out_dir)
            show(console, result)
            timings.append((name, watch.seconds, path))
    finish(console, "bench smoke", timings, total.seconds)
    shutil.rmtree(workdir, ignore_errors=True)  # logs: kept only when a step failed


@app.command("all")
def run_all(
    profile: Path = typer.Option(DEFAULT_PROFILE, help="Profile of the stack and raw vLLM."),
    out_dir: Path = typer.Option(RESULTS_DIR, help="Where the results go."),
    only: list[str] = typer.Option([], help="Run only these results (e.g. --only serving)."),
) -> None:
    """Every benchmark with its documented settings, one after the other, each in its own process (long)."""
    console = Console()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-all-"))
    timings = []
    with Stopwatch() as total:
        for script in full_run(profile):
            if only and script.result not in only:
                continue
            console.rule(f"{script.result}: bench/{script.script} {' '.join(script.args)}")
            out = out_dir / f"{script.result}.json"
            args = (
                [*script.args, "--json", str(out)]
                if script.script == "bench_speculative.py"
                else [*script.args, "--out-dir", str(out_dir)]
            )
            log = log_dir / f"{script.result}.log"
            with Stopwatch() as watch:
                group = ProcessGroup.start([sys.executable, str(BENCH_DIR / script.script), *args], child_env(), log)
                try:
                    code = group.process.wait(timeout=STEP_TIMEOUT_S)
                finally:
                    group.stop(grace_s=0)  # its session: whatever it left behind
            if code != 0:
                console.print(f"[red]{script.result} failed (exit {code}); log {log}:")
                console.print(group.log_tail(), markup=False, highlight=False)
                raise typer.Exit(1)
            show(console, read_result(out))
            timings.append((script.result, watch.seconds, out))
    finish(console, "bench all", timings, total.seconds)


if __name__ == "__main__":
    app()
