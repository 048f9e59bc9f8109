"""Regenerate the docs' benchmark tables and plots from the JSON results; runs no benchmark.

    .venv/bin/python bench/report.py            # rewrite the docs' marked tables, docs/img/*.png
    .venv/bin/python bench/report.py --check    # exit 1, naming them, if a doc's marked tables differ from the results

A table is regenerated when it stands between

    <!-- bench-report:KEY -->
    ...
    <!-- /bench-report:KEY -->

where KEY is a result's name (bench/results/NAME.json) or smoke/NAME (bench/results/smoke/NAME.json), in any
Markdown file under docs/ (today docs/BENCHMARKS.md, the current figures, and
docs/archive/BENCHMARKS-detail-2026-12.md, their full tables; docs/GPU.md would be checked the same way if it
had one). Text outside the markers is never touched; tests/unit/bench/test_bench_docs.py fails when a marked table is
stale or has no result. A superseded run moves to docs/archive/BENCHMARKS-history.md as plain text, without
markers. Plots prefer a full run's result and fall back to the smoke run's; each plot names the file it was
drawn from.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

import typer
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when run as a script

from bench import bench_embedding, bench_engine_fidelity, bench_gateway, bench_limits, bench_retrieval  # noqa: E402
from bench import bench_cold_start, bench_retrieval_scale, bench_spec_stack, bench_speculative  # noqa: E402
from bench import draft_agreement, rag_latency  # noqa: E402
from bench.harness.results import RESULTS_DIR, BenchResult, read_result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOCS_DIR = ROOT / "docs"
DOCS = DOCS_DIR / "BENCHMARKS.md"  # the current figures; the first of marked_docs()
IMG_DIR = ROOT / "docs" / "img"
# Which module formats which result, by the result's name.
TABLES: dict[str, Callable[[BenchResult], str]] = {
    "serving": bench_gateway.tables,
    "serving-before-niceness": bench_gateway.tables,  # the stack at Ray's nice 15, under background load
    "serving-direct-ingress": bench_gateway.tables,  # gateway.direct_ingress: true
    "retrieval": bench_retrieval.tables,
    "retrieval-scale": bench_retrieval_scale.tables,
    "retrieval-scale-100k-quiet": bench_retrieval_scale.tables,  # the 100k rows again, on a quiet machine
    "rag-latency": rag_latency.tables,
    "embedding": bench_embedding.tables,
    "limits": bench_limits.tables,
    "engine-fidelity": bench_engine_fidelity.tables,
    "speculative": bench_speculative.tables,
    "speculative-eager": bench_speculative.tables,
    "speculative-stack": bench_spec_stack.tables,
    "cold-start": bench_cold_start.tables,
    "draft-agreement": draft_agreement.tables,
}
MARKER = re.compile(r"(<!-- bench-report:(?P<key>[\w/.-]+) -->\n)(?P<body>.*?)(<!-- /bench-report:(?P=key) -->)", re.S)

app = typer.Typer(add_completion=False, help=__doc__.splitlines()[0])


def load_results(results_dir: Path, console: Console | None = None) -> dict[str, tuple[BenchResult, Path]]:
    """Every readable result under results_dir (and its smoke/), by key: NAME or smoke/NAME. Files in another
    format (e.g. gpu-embedder-h200.json, written by its own script) are skipped."""
    found = {}
    for prefix, directory in (("", results_dir), ("smoke/", results_dir / "smoke")):
        for path in sorted(directory.glob("*.json")):
            try:
                result = read_result(path)
            except (ValueError, TypeError, KeyError) as exc:
                if console:
                    console.print(
                        f"[dim]skipped {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {exc}"
                    )
                continue
            found[prefix + path.stem] = (result, path)
    return found


def table_for(key: str, result: BenchResult) -> str | None:
    formatter = TABLES.get(key.split("/")[-1])
    return formatter(result) if formatter else None


def render_docs(text: str, results: dict[str, tuple[BenchResult, Path]]) -> tuple[str, list[str]]:
    """text with every marked table whose result exists regenerated; the keys that had no result."""
    missing = []

    def replace(match: re.Match) -> str:
        key = match["key"]
        table = table_for(key, results[key][0]) if key in results else None
        if table is None:
            missing.append(key)
            return match.group(0)
        return f"{match.group(1)}{table.strip()}\n{match.group(4)}"

    return MARKER.sub(replace, text), missing


def stale_tables(text: str, results: dict[str, tuple[BenchResult, Path]]) -> list[str]:
    """The keys of text's marked tables that differ from what their result gives today (tables without a
    result are not counted here: render_docs reports them)."""
    stale = []
    for match in MARKER.finditer(text):
        key = match["key"]
        table = table_for(key, results[key][0]) if key in results else None
        if table is not None and match["body"] != f"{table.strip()}\n":
            stale.append(key)
    return stale


def marked_docs(docs_dir: Path = DOCS_DIR) -> list[Path]:
    """Every Markdown file under docs_dir with at least one marked table, BENCHMARKS.md first."""
    found = [path for path in sorted(docs_dir.rglob("*.md")) if MARKER.search(path.read_text())]
    return sorted(found, key=lambda path: path != DOCS)


def check_docs(docs: list[Path], results: dict[str, tuple[BenchResult, Path]]) -> dict[Path, list[str]]:
    """For each doc, the keys of its marked tables that are stale or have no result (docs without a problem
    are left out): what `--check` fails on."""
    problems = {}
    for doc in docs:
        text = doc.read_text()
        _, missing = render_docs(text, results)
        if bad := stale_tables(text, results) + missing:
            problems[doc] = bad
    return problems


def _preferred(results: dict, name: str) -> tuple[BenchResult, Path] | None:
    return results.get(name) or results.get(f"smoke/{name}")


def write_plots(results: dict[str, tuple[BenchResult, Path]], img_dir: Path) -> list[Path]:
    from bench import plots  # matplotlib only when plotting

    written = []
    if found := _preferred(results, "serving"):
        written.append(plots.serving_plot(found[0], _short(found[1]), img_dir / "serving.png"))
    spec = [
        (results[key][0], _short(results[key][1]), title)
        for key, title in (
            ("speculative-eager", "eager engine (as the stack runs)"),
            ("speculative", "compiled engine"),
        )
        if key in results
    ]
    if spec:
        written.append(plots.speculative_plot(spec, img_dir / "speculative.png"))
    if found := _preferred(results, "retrieval"):
        written.append(plots.retrieval_plot(found[0], _short(found[1]), img_dir / "retrieval.png"))
    if found := _preferred(results, "retrieval-scale"):
        written.append(plots.retrieval_scale_plot(found[0], _short(found[1]), img_dir / "retrieval-scale.png"))
    return written


def _short(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


@app.command()
def main(
    results_dir: Path = typer.Option(RESULTS_DIR, help="Where the JSON results are."),
    docs: list[Path] = typer.Option(
        None, help="A Markdown file with marked tables (repeatable); default: every file under docs/ that has one."
    ),
    img_dir: Path = typer.Option(IMG_DIR, help="Where the PNG plots go."),
    check: bool = typer.Option(False, help="Only compare the docs' marked tables with the results."),
) -> None:
    console = Console()
    results = load_results(results_dir, console)
    docs = docs or marked_docs()
    if check:
        problems = check_docs(docs, results)
        for doc, keys in problems.items():
            console.print(
                f"[red]{_short(doc)}: marked tables stale or without a result: {', '.join(keys)}; run bench/report.py"
            )
        if problems:
            raise typer.Exit(1)
        console.print(f"marked tables match the results: {', '.join(str(_short(doc)) for doc in docs)}")
        return
    for doc in docs:
        text = doc.read_text()
        updated, missing = render_docs(text, results)
        for key in missing:
            console.print(f"[yellow]{_short(doc)}: no result for the marked table {key!r}; left as it is")
        if updated != text:
            doc.write_text(updated)
            console.print(f"rewrote the marked tables of {_short(doc)}")
        else:
            console.print(f"{_short(doc)}: marked tables already match the results")
    for path in write_plots(results, img_dir):
        console.print(f"wrote {_short(path)}")


if __name__ == "__main__":
    app()
