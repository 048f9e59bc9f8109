"""`poolserve ingest --sync` and `poolserve watch` (cli/sync.py) against an in-memory stand-in for the
gateway's document routes: the plan (add, replace, delete, unchanged), a dry run that changes nothing,
a sync that makes the collection equal to the folder, a rerun that does nothing, and watch noticing
adds, edits and deletes without reading unchanged files again."""

from __future__ import annotations

import io
from pathlib import Path
from urllib.parse import unquote

from rich.console import Console

from cli.files import HASH_KEY, SourceFile, content_hash, document_id
from cli.sync import HashCache, plan_sync, sync_once, watch


class FakeGateway:
    """The document routes the CLI uses: paged listing, streamed ingest, delete."""

    def __init__(self) -> None:
        self.docs: dict[str, dict] = {}
        self.calls: list[tuple[str, str]] = []

    def request(self, method, path, ok_missing=False, params=None, json=None):
        self.calls.append((method, path))
        if method == "GET":
            if not self.docs:
                return None  # a collection that does not exist yet
            return {"data": [{"id": i, "metadata": m} for i, m in sorted(self.docs.items())], "has_more": False}
        if method == "DELETE":
            self.docs.pop(unquote(path.rsplit("/", 1)[1]), None)
            return {}
        raise AssertionError(f"unexpected {method} {path}")

    def stream_lines(self, path, body):
        self.calls.append(("POST", path))
        for doc in body["documents"]:
            self.docs[doc["id"]] = doc["metadata"]
        yield {"event": "done", "chunks": len(body["documents"])}


def quiet() -> Console:
    return Console(file=io.StringIO())


def folder(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "docs"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def source(name: str) -> SourceFile:
    return SourceFile(Path(name), name, "text/plain")


def test_the_plan_adds_replaces_deletes_and_keeps_unreadable_files():
    stored = {
        document_id("docs/same.txt"): {HASH_KEY: "h1"},
        document_id("docs/edited.txt"): {HASH_KEY: "old"},
        document_id("docs/gone.txt"): {HASH_KEY: "h3"},
        document_id("docs/locked.txt"): {HASH_KEY: "h4"},
        "added-by-api": {},
    }
    plan = plan_sync(
        [
            (source("docs/same.txt"), "h1"),
            (source("docs/edited.txt"), "new"),
            (source("docs/new.txt"), "h5"),
            (source("docs/locked.txt"), None),
        ],
        stored,
    )
    assert [s.source for s in plan.add] == ["docs/new.txt"] and [s.source for s in plan.replace] == ["docs/edited.txt"]
    assert plan.delete == sorted([document_id("docs/gone.txt"), "added-by-api"])  # equal to the folder
    assert plan.unchanged == 1 and plan.unreadable == [("docs/locked.txt", "cannot read it")]
    assert plan.summary() == "1 to add, 1 to replace, 2 to delete, 1 unchanged"


def test_a_dry_run_changes_nothing_then_the_sync_makes_the_collection_equal_to_the_folder(tmp_path):
    gateway = FakeGateway()
    gateway.docs = {"stale": {HASH_KEY: "x"}}
    root = folder(tmp_path, {"a.md": "alpha", "sub/b.txt": "beta"})
    plan, report = sync_once(gateway, "kb", [root], quiet(), apply=False)
    assert report is None and plan.summary() == "2 to add, 0 to replace, 1 to delete, 0 unchanged"
    assert list(gateway.docs) == ["stale"]
    plan, report = sync_once(gateway, "kb", [root], quiet(), apply=True)
    assert report.ingest.sent == 2 and report.deleted == 1 and report.failed == []
    assert set(gateway.docs) == {document_id("docs/a.md"), document_id("docs/sub/b.txt")}
    assert gateway.docs[document_id("docs/a.md")][HASH_KEY] == content_hash(b"alpha")
    posts = [c for c in gateway.calls if c[0] in ("POST", "DELETE")]
    assert posts[-1][0] == "DELETE", "deletions come after the files are in (a rename is never missing)"
    again, report = sync_once(gateway, "kb", [root], quiet(), apply=True)
    assert report is None and again.changes == 0 and again.unchanged == 2  # a rerun (a resume) repeats nothing


def test_watch_follows_adds_edits_and_deletes_and_reads_unchanged_files_once(tmp_path, monkeypatch):
    gateway = FakeGateway()
    root = folder(tmp_path, {"a.md": "alpha", "b.md": "beta"})
    reads = []
    original = Path.read_bytes

    def counting(path):
        reads.append(path.name)
        return original(path)

    monkeypatch.setattr(Path, "read_bytes", counting)
    steps = iter(
        [
            lambda: (root / "c.md").write_text("gamma"),
            lambda: ((root / "a.md").write_text("alpha, edited and longer"), (root / "b.md").unlink()),
            lambda: None,
        ]
    )
    failures = watch(gateway, "kb", [root], quiet(), interval_s=0.0, cycles=4, sleep=lambda s: next(steps)())
    assert failures == 0
    assert set(gateway.docs) == {document_id("docs/a.md"), document_id("docs/c.md")}
    assert gateway.docs[document_id("docs/a.md")][HASH_KEY] == content_hash(b"alpha, edited and longer")
    hashed = [name for name in reads]
    assert hashed.count("b.md") == 2, "b.md: hashed once by the cache, read once to send; never again"


def test_the_hash_cache_reads_a_file_again_only_when_it_changes(tmp_path):
    path = tmp_path / "f.txt"
    path.write_text("one")
    cache = HashCache()
    assert cache.digest(path) == content_hash(b"one")
    path.write_text("two!")  # another size: read again
    assert cache.digest(path) == content_hash(b"two!")
    assert cache.digest(tmp_path / "missing.txt") is None
