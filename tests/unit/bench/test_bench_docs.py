"""docs/BENCHMARKS.md stays findable: every generated table in docs/ (BENCHMARKS.md's and its full record's,
docs/archive/BENCHMARKS-detail-2026-12.md) matches bench/results/ (what `bench/report.py --check` checks), the
page stays short and numbered 1, 2, ... with sub-sections 2.1, 2.2, ... in order, its record keeps every section
under the same heading, and every link from the README and docs/ into it or its archives lands on a heading."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import report

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "BENCHMARKS.md"
ARCHIVE = ROOT / "docs" / "archive" / "BENCHMARKS-history.md"  # superseded runs: frozen, no marked tables
DETAIL = ROOT / "docs" / "archive" / "BENCHMARKS-detail-2026-12.md"  # each section's full record
# The files whose links into DOC and ARCHIVE are checked.
SOURCES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "archive").glob("*.md"))]
# Every marked table, by file; one that disappears is no longer regenerated, so its removal must be deliberate.
MARKED = {
    DOC: {"retrieval-scale-100k-quiet", "rag-latency", "cold-start"},
    DETAIL: {
        "engine-fidelity",
        "speculative-eager",
        "speculative",
        "retrieval-scale",
        "retrieval-scale-100k-quiet",
        "rag-latency",
        "serving",
        "speculative-stack",
        "cold-start",
        "smoke/serving",
        "smoke/retrieval",
        "smoke/limits",
    },
}
MAX_LINES = 300  # issue 47: the current figures only, about 300 lines

HEADING = re.compile(r"(#{1,6}) +(.+?) *#* *$")
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def headings(text: str) -> list[tuple[int, str, str]]:
    """(level, text, GitHub anchor) of every heading outside fenced code blocks."""
    found, seen, fence = [], {}, False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
            continue
        match = None if fence else HEADING.match(line)
        if match:
            title = match.group(2)
            base = github_anchor(title)
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.append((len(match.group(1)), title, base if count == 0 else f"{base}-{count}"))
    return found


def github_anchor(title: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation (backticks, dots, colons, quotes, ...) removed,
    spaces to hyphens; links and images count by their text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", title)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def test_github_anchor():
    assert github_anchor("2.6 Threads per step: every core (2026-12-05)") == "26-threads-per-step-every-core-2026-12-05"
    assert (
        github_anchor("1.2 `dtype: auto` on a CPU (`bench/bench_cpu_dtype.py`)")
        == "12-dtype-auto-on-a-cpu-benchbench_cpu_dtypepy"
    )
    assert [h[2] for h in headings("## What\n```\n# not a heading\n```\n### What\n")] == ["what", "what-1"]


def test_marked_tables_match_the_results():
    """`bench/report.py --check`, in process: no marked table in docs/ is stale or without its result."""
    assert report.marked_docs() == list(MARKED)
    results = report.load_results(report.RESULTS_DIR)
    for doc, keys in MARKED.items():
        text = doc.read_text()
        assert {m["key"] for m in report.MARKER.finditer(text)} == keys, doc
        updated, missing = report.render_docs(text, results)
        assert not missing, f"{doc.name}: marked tables without a result in bench/results/: {missing}"
        stale = report.stale_tables(text, results)
        assert not stale, f"{doc.name}: marked tables {stale} differ from bench/results/: run bench/report.py"
        assert updated == text
    assert report.check_docs(list(MARKED), results) == {}


def test_report_check_exits_nonzero_on_a_stale_table(tmp_path):
    """The CLI's --check, on a copy of the page with one table changed."""
    from typer.testing import CliRunner

    text = DOC.read_text()
    body = next(m for m in report.MARKER.finditer(text) if m["key"] == "cold-start")
    stale = tmp_path / "BENCHMARKS.md"
    stale.write_text(text[: body.start("body")] + body["body"].replace("|", "| ", 1) + text[body.end("body") :])
    fresh = tmp_path / "fresh.md"
    fresh.write_text(text)
    runner = CliRunner()
    assert runner.invoke(report.app, ["--check", "--docs", str(fresh)]).exit_code == 0
    failed = runner.invoke(report.app, ["--check", "--docs", str(fresh), "--docs", str(stale)])
    assert failed.exit_code == 1 and "cold-start" in failed.output


def test_the_page_is_short_and_its_record_keeps_every_section():
    """BENCHMARKS.md holds the current figures; every numbered section of it is in the record under the same
    heading (so a section's anchor works in both), and the record keeps the old numbers' table."""
    text = DOC.read_text()
    assert len(text.splitlines()) <= MAX_LINES
    numbered = {title for level, title, _ in headings(text) if level in (2, 3) and title[0].isdigit()}
    record = {title for _, title, _ in headings(DETAIL.read_text())}
    assert numbered <= record, f"sections of BENCHMARKS.md missing from {DETAIL.name}: {sorted(numbered - record)}"
    assert "Old section numbers" in record
    assert DETAIL.name in text


def test_stale_tables_names_the_stale_one():
    text = DOC.read_text()
    results = report.load_results(report.RESULTS_DIR)
    body = next(m for m in report.MARKER.finditer(text) if m["key"] == "cold-start")
    changed = text[: body.start("body")] + body["body"].replace("|", "| ", 1) + text[body.end("body") :]
    assert report.stale_tables(changed, results) == ["cold-start"]


def test_archive_has_no_marked_tables():
    """Superseded runs are frozen: a marked table there would be rewritten by a later run of its benchmark."""
    assert "bench-report:" not in ARCHIVE.read_text()


def test_sections_are_numbered_in_order():
    heads = headings(DOC.read_text())
    second = [title for level, title, _ in heads if level == 2]
    assert second[0] == "Current figures and decisions", "the summary comes first"
    top, subs, numbers = 0, 0, []
    for level, title, _ in heads:
        if level not in (2, 3) or not title[0].isdigit():
            continue
        if level == 2:
            match = re.fullmatch(r"(\d+)\. \S.*", title)
            assert match, f"a section's heading is 'N. Title': {title!r}"
            assert int(match.group(1)) == top + 1, f"section {match.group(1)} after {top}: {title!r}"
            top, subs = top + 1, 0
            numbers.append(str(top))
        else:
            match = re.fullmatch(r"(\d+)\.(\d+) \S.*", title)
            assert match, f"a sub-section's heading is 'N.M Title' (no letters or primes): {title!r}"
            assert (int(match.group(1)), int(match.group(2))) == (top, subs + 1), (
                f"sub-section {match.group(1)}.{match.group(2)} after {top}.{subs}: {title!r}"
            )
            subs += 1
            numbers.append(f"{top}.{subs}")
    assert top >= 10 and len(numbers) == len(set(numbers))
    anchors = [anchor for _, _, anchor in heads]
    assert len(anchors) == len(set(anchors))


def _anchors(path: Path) -> set[str]:
    return {anchor for _, _, anchor in headings(path.read_text())}


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_into_the_benchmarks_resolve(source):
    targets = {path.resolve(): _anchors(path) for path in (DOC, ARCHIVE, DETAIL)}
    broken = []
    text = re.sub(r"```.*?```", "", source.read_text(), flags=re.S)
    for link in LINK.findall(text):
        if re.match(r"[a-z]+:", link):
            continue  # http:, mailto:, ...
        path, _, anchor = link.partition("#")
        target = (source.parent / path).resolve() if path else source.resolve()
        if target not in targets:
            continue
        if anchor and anchor not in targets[target]:
            broken.append(link)
    assert not broken, f"{source.relative_to(ROOT)}: links to no heading: {broken}"


SECTION_REF = re.compile(
    r"BENCHMARKS(?:\.md)?,?\s+(?:sections?\s+|§\s?)?"
    r"((?:\d+(?:\.\d+)?[a-z]?'*)(?:(?:,\s*|\s+and\s+)\d+(?:\.\d+)?[a-z]?'*)*)"
)


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_section_numbers_cited_exist(source):
    """'docs/BENCHMARKS.md section 2.6' and the like name a section that exists (letter-and-prime numbers such as
    '7c' are the old scheme: the 'Old section numbers' table of the page's record maps them)."""
    heads = headings(DOC.read_text())
    numbers = {
        re.match(r"(\d+(?:\.\d+)?)", title).group(1)
        for level, title, _ in heads
        if level in (2, 3) and title[0].isdigit()
    }
    cited = []
    for match in SECTION_REF.finditer(source.read_text()):
        cited += [ref for ref in re.split(r",\s*|\s+and\s+", match.group(1)) if re.fullmatch(r"\d+(?:\.\d+)?", ref)]
    missing = sorted(set(cited) - numbers)
    assert not missing, f"{source.relative_to(ROOT)} cites docs/BENCHMARKS.md sections that do not exist: {missing}"
