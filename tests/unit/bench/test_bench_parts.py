"""bench/ is one harness (issue 47 item 4): every script under bench/ is a benchmark `bench/run.py all` runs, a
part it lists to run by hand (`bench/run.py parts`), or a module another part imports. No stack, no engine."""

from __future__ import annotations

import re
from pathlib import Path

from bench import run

ROOT = Path(__file__).resolve().parents[3]
BENCH = ROOT / "bench"


def imported_by_the_harness() -> set[str]:
    """The bench/*.py modules that bench's own code imports (bench.X, or `from bench import X, Y`)."""
    names: set[str] = set()
    for path in [*BENCH.glob("*.py"), *(BENCH / "harness").glob("*.py")]:
        text = path.read_text()
        names |= set(re.findall(r"\bbench\.([a-z_0-9]+)\b", text))
        for group in re.findall(r"^\s*from bench import ([a-z_0-9, ]+)", text, flags=re.MULTILINE):
            names |= {name.strip() for name in group.split(",")}
    return names


def test_every_script_under_bench_is_a_part_or_imported_by_one():
    in_all = {script.script for script in run.full_run(ROOT / "configs" / "cpu-tiny.yaml")}
    by_hand = {part.script for part in run.PARTS}
    imported = imported_by_the_harness()
    entry_points = {"run.py", "report.py", "__init__.py"}
    loose = [
        path.name
        for path in sorted(BENCH.glob("*.py"))
        if path.name not in in_all | by_hand | entry_points and path.stem not in imported
    ]
    assert not loose, f"bench/ scripts that are no part of the harness: {loose} (bench/run.py: full_run or PARTS)"


def test_every_part_names_a_script_that_exists_and_one_group_each():
    parts = [*run.full_run(ROOT / "configs" / "cpu-tiny.yaml"), *run.PARTS]
    for part in parts:
        assert (BENCH / part.script).is_file(), part
    assert {part.group for part in run.PARTS} == {"gpu", "stack", "memory", "tools"}
    assert len({part.script for part in run.PARTS}) == len(run.PARTS)


def test_all_writes_each_result_where_run_reads_it():
    out = Path("/results")
    scripts = {script.result: script for script in run.full_run(ROOT / "configs" / "cpu-tiny.yaml")}
    assert len(scripts) == len(run.full_run(ROOT / "configs" / "cpu-tiny.yaml")), "one script a result name"
    assert scripts["speculative"].argv(out)[-2:] == ["--json", "/results/speculative.json"]
    assert scripts["rag-quality"].argv(out)[-2:] == ["--out", "/results/rag-quality.json"]
    assert scripts["store"].argv(out) == ["--out-dir", "/results"]
    assert scripts["limits"].argv(out) == ["--rounds", "2000", "--out-dir", "/results"]


def test_all_shows_a_report_of_another_format_by_its_file(capsys):
    from rich.console import Console

    run.show_file(Console(width=200), ROOT / "bench" / "results" / "rag-quality.json")
    assert "its script's own format" in capsys.readouterr().out
