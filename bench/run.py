"""Run the benchmarks: `smoke` (a few minutes, proves the harness end to end) or `all` (every one; long).

`all` runs every CPU benchmark with its documented settings. Results go to bench/results/ (smoke:
bench/results/smoke/) in the one JSON format of bench/harness/results.py; bench/report.py turns them
into the docs' tables and plots. `parts` lists every part of the harness: the benchmarks of `all`, and those
run by hand with the command it prints: on a GPU host (scripts/gpu_session.sh runs most), against a
stack already running (soaks), the memory studies, and the tools that make the corpora or re-read results.

    .venv/bin/python bench/run.py smoke        # make bench-smoke
    .venv/bin/python bench/run.py all          # make bench
    .venv/bin/python bench/run.py parts        # every part, and the command of each

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
SMOKE_FIRST_TOKEN_PROBES = 5  # one warm-up and 4 timed streams a server
SMOKE_RETRIEVAL = {"sizes": [2000], "kinds": ["flat", "hnsw"], "n_queries": 100, "seed": 0}
SMOKE_LIMITER_ROUNDS = 2000
STEP_TIMEOUT_S = 3600  # one benchmark of `all`; the speculative ones take 10-20 minutes

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.splitlines()[0])


@dataclass(frozen=True)
class Script:
    """One benchmark of `all`: its script, arguments and the result file it writes. `output` is the flag that
    tells the script where: `--out-dir` takes the results folder (the script names its file `result`.json),
    `--out` and `--json` the file itself."""

    result: str
    script: str
    args: tuple[str, ...] = ()
    output: str = "--out-dir"

    def argv(self, out_dir: Path) -> list[str]:
        where = out_dir if self.output == "--out-dir" else out_dir / f"{self.result}.json"
        return [*self.args, self.output, str(where)]


@dataclass(frozen=True)
class Part:
    """A part of the harness that `all` does not run: where it runs, and the command (from the repository root)."""

    group: str
    script: str
    command: str
    what: str


# Run by hand: each needs what `all` cannot give it (a GPU, a stack already running, hours alone on a quiet
# machine), or it makes inputs or re-reads results rather than measuring. Documented where `what` says.
PARTS = (
    Part(
        "gpu",
        "bench_gpu_plan.py",
        "python3 bench/bench_gpu_plan.py --profile configs/gh200-two-engines.yaml --out DIR --squeeze --ingest",
        "the stack from a GPU profile against its plan, per replica (docs/GPU.md; scripts/gpu_session.sh plan)",
    ),
    Part(
        "gpu",
        "gpu_decode_modes.py",
        "python3 bench/gpu_decode_modes.py --profile configs/gh200-bench.yaml --out DIR",
        "raw vLLM's single-stream decode per compilation mode against the HBM roofline (docs/GPU.md; gpu_session.sh decode)",
    ),
    Part(
        "gpu",
        "bench_on_demand.py",
        "python3 bench/bench_on_demand.py --profile configs/h100-on-demand.yaml --out DIR --swaps 20",
        "model swaps through the stack (docs/GPU.md, docs/results/on-demand-cpu-2026-12-06.md; gpu_session.sh ondemand)",
    ),
    Part(
        "gpu",
        "bench_gpu_embedder.py",
        "python bench/bench_gpu_embedder.py --model models/all-MiniLM-L6-v2 --out results.json",
        "the embedder on a GPU: context, weights, activations, throughput (docs/BENCHMARKS.md section 6)",
    ),
    Part(
        "stack",
        "bench_worker_spin.py",
        ".venv/bin/python bench/bench_worker_spin.py --stack STACK_DIR --label LABEL --out bench/results/worker-spin.json",
        "what the vLLM Worker's busy-wait costs and buys, on a running stack (docs/SECURITY.md; tests/integration)",
    ),
    Part(
        "stack",
        "soak_memory.py",
        ".venv/bin/python bench/soak_memory.py --state-dir STATE_DIR --seconds 3900 --out bench/results/soak.jsonl",
        "every process of a running stack from /proc, for a soak (docs/STRESS.md)",
    ),
    Part(
        "stack",
        "soak_documents.py",
        ".venv/bin/python bench/soak_documents.py --base-url URL --seconds 3600 --out bench/results/soak-documents.jsonl",
        "real documents into a running stack for a soak, with /status per replica (docs/STRESS.md)",
    ),
    Part(
        "memory",
        "heap_by_mapping.py",
        ".venv/bin/python bench/heap_by_mapping.py PID [--save snap.json]; --diff before.json after.json",
        "a process's resident memory by kind of mapping (docs/STRESS.md)",
    ),
    Part(
        "memory",
        "probe_embedder_memory.py",
        ".venv/bin/python bench/probe_embedder_memory.py --docs 300 --out bench/results/embedder-heap-probe.json",
        "the embedder's heap after real documents, per variant; alone on a quiet machine (docs/STRESS.md)",
    ),
    Part(
        "memory",
        "driver_heap_probe.py",
        "[PYTHONMALLOC=malloc] PYTHONPATH=$PWD .venv/bin/python bench/driver_heap_probe.py --cycles 8",
        "what an on-demand CPU replica's heap keeps from each engine it stopped, per allocator "
        "(docs/results/on-demand-cpu-endurance-2026-12-06.md)",
    ),
    Part(
        "tools",
        "make_rag_corpus.py",
        ".venv/bin/python bench/make_rag_corpus.py",
        "makes bench/data/stdlib-pydoc.jsonl.gz, the corpus of the RAG benchmarks",
    ),
    Part(
        "tools",
        "make_outside_corpora.py",
        ".venv/bin/python bench/make_outside_corpora.py [--debs DIR] [--only apache]",
        "makes the outside corpora bench/data/*.jsonl.gz from Debian packages' manuals (apt-get download)",
    ),
    Part(
        "tools",
        "rag_fusion_grid.py",
        ".venv/bin/python bench/rag_fusion_grid.py tuning=NAME:CANDIDATES.jsonl.gz,... --out FILE",
        "fusion settings on the candidates of bench_rag_quality.py --candidates-out, without another ingest",
    ),
)


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
        Script("speculative-eager", "bench_speculative.py", ("--profile", str(profile), "--eager"), output="--json"),
        Script(
            "speculative",
            "bench_speculative.py",
            ("--profile", str(profile), "--preloads", preloads),
            output="--json",
        ),
        Script("draft-agreement", "draft_agreement.py", ("--profile", str(profile))),
        Script("cpu-dtype", "bench_cpu_dtype.py", ("--profile", str(profile))),
        Script(
            "chat-threads",
            "bench_chat_threads.py",
            ("--profile", str(profile), "--threads", "1,2,2s", "--conditions", "idle,busy"),
        ),
        Script("embed-batch", "bench_embed_batch.py", ("--profile", str(profile))),
        Script("split-engine", "bench_split_engine.py", ("--variants", "whole,split-own-cores")),
        Script("retriever_memory", "bench_retriever_memory.py", ("--steps", "500", "5000", "10000", "20000")),
        Script("store", "bench_store.py"),
        Script("rag-quality", "bench_rag_quality.py", output="--out"),
        Script(
            "rag-quality-rsyslog-doc",
            "bench_rag_quality.py",
            rag_corpus("rsyslog-doc") + ("--chunkings", "tokens-200-30"),
            output="--out",
        ),
        Script("rag-rewrite-sqlite-doc", "bench_rag_rewrite.py", rag_corpus("sqlite-doc"), output="--out"),
        Script(
            "rag-answer-length",
            "bench_rag_answers.py",
            ("--profile", str(profile), "--max-tokens", "default,256", "--stream", "--start-timeout", "900"),
        ),
    ]


def rag_corpus(name: str) -> tuple[str, ...]:
    return ("--corpus", f"bench/data/{name}.jsonl.gz", "--questions", f"bench/data/{name}-questions.json")


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


def show_file(console: Console, path: Path) -> None:
    """A result of the one format with its table; the RAG studies' own reports by their file alone."""
    try:
        result = read_result(path)
    except ValueError:  # another format (BenchResult.from_dict)
        console.print(f"{path}: a report in its script's own format", markup=False, highlight=False)
        return
    show(console, result)


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
        (
            "serving",
            lambda: bench_gateway.run(
                profile, [SMOKE_SERVING], workdir, running=running, first_token_probes=SMOKE_FIRST_TOKEN_PROBES
            ),
        ),
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
            log = log_dir / f"{script.result}.log"
            argv = [sys.executable, str(BENCH_DIR / script.script), *script.argv(out_dir)]
            with Stopwatch() as watch:
                group = ProcessGroup.start(argv, child_env(), log)
                try:
                    code = group.process.wait(timeout=STEP_TIMEOUT_S)
                finally:
                    group.stop(grace_s=0)  # its session: whatever it left behind
            if code != 0:
                console.print(f"[red]{script.result} failed (exit {code}); log {log}:")
                console.print(group.log_tail(), markup=False, highlight=False)
                raise typer.Exit(1)
            show_file(console, out)
            timings.append((script.result, watch.seconds, out))
    finish(console, "bench all", timings, total.seconds)


@app.command()
def parts(
    profile: Path = typer.Option(DEFAULT_PROFILE, help="Profile the commands of `all` are shown with."),
) -> None:
    """Every part of the harness: the benchmarks `all` runs, and the command of each one run by hand."""
    console = Console()
    table = Table(title="bench/run.py all")
    table.add_column("result")
    table.add_column("command")
    for script in full_run(profile):
        table.add_row(script.result, f"bench/{script.script} {' '.join(script.args)}")
    console.print(table)
    table = Table(title="run by hand (bench/run.py runs none of these)")
    for column in ("group", "script", "command", "what"):
        table.add_column(column, overflow="fold")
    for part in PARTS:
        table.add_row(part.group, part.script, part.command, part.what)
    console.print(table)


if __name__ == "__main__":
    app()
