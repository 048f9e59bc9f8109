"""`poolserve ingest DIR --sync` and `poolserve watch DIR`: keep a collection equal to folders.

A sync compares the files under the folders (document ids from their paths, cli/files.py) with the
documents the collection holds (their `sha256` metadata): new files are added, changed ones replaced,
and documents whose file is gone deleted, in that order (so a renamed file is never missing in
between). Every run starts from what the server holds, so a sync that was stopped (Ctrl-C, a restart
of either side) resumes by running again: what was done is not done twice.

`watch` syncs, then polls: a file whose size and modification time are unchanged is not read again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from rich.console import Console

from cli.client import ClientError, StackClient
from cli.files import HASH_KEY, SourceFile, content_hash, document_id, walk
from cli.ingest import IngestReport, ingest_files, stored_metadata


@dataclass
class SyncPlan:
    add: list[SourceFile] = field(default_factory=list)
    replace: list[SourceFile] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)  # document ids
    unchanged: int = 0
    unreadable: list[tuple[str, str]] = field(default_factory=list)

    @property
    def changes(self) -> int:
        return len(self.add) + len(self.replace) + len(self.delete)

    def summary(self) -> str:
        return (
            f"{len(self.add)} to add, {len(self.replace)} to replace, {len(self.delete)} to delete, "
            f"{self.unchanged} unchanged"
        )


def plan_sync(files: list[tuple[SourceFile, str | None]], stored: dict[str, dict]) -> SyncPlan:
    """What makes the collection (`stored`: document id -> metadata) equal to `files` (each with its
    content hash; None when it could not be read). An unreadable file keeps its stored document: a
    file that cannot be read now is not a file that is gone."""
    plan, present = SyncPlan(), set()
    for source, digest in files:
        doc_id = document_id(source.source)
        present.add(doc_id)
        if digest is None:
            plan.unreadable.append((source.source, "cannot read it"))
        elif doc_id not in stored:
            plan.add.append(source)
        elif (stored[doc_id] or {}).get(HASH_KEY) == digest:
            plan.unchanged += 1
        else:
            plan.replace.append(source)
    plan.delete = sorted(doc_id for doc_id in stored if doc_id not in present)
    return plan


class HashCache:
    """Content hashes by path, read again only when a file's size or modification time changes."""

    def __init__(self) -> None:
        self._seen: dict[Path, tuple[int, int, str]] = {}

    def digest(self, path: Path) -> str | None:
        try:
            stat = path.stat()
            cached = self._seen.get(path)
            if cached and cached[:2] == (stat.st_size, stat.st_mtime_ns):
                return cached[2]
            digest = content_hash(path.read_bytes())
        except OSError:
            return None
        self._seen[path] = (stat.st_size, stat.st_mtime_ns, digest)
        return digest


@dataclass
class SyncReport:
    ingest: IngestReport
    deleted: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)


def sync_once(
    client: StackClient,
    collection: str,
    folders: list[Path],
    console: Console,
    apply: bool,
    hashes: HashCache | None = None,
) -> tuple[SyncPlan, SyncReport | None]:
    """Plan a sync of `collection` to `folders`; carry it out when `apply`. The plan is always returned."""
    hashes = hashes or HashCache()
    files, _ = walk(folders)
    stored = stored_metadata(client, collection)
    plan = plan_sync([(f, hashes.digest(f.path)) for f in files], stored)
    if not apply or not plan.changes:
        return plan, None
    report = SyncReport(
        ingest_files(client, collection, plan.add + plan.replace, console, stored=stored)
        if plan.add or plan.replace
        else IngestReport()
    )
    report.failed += plan.unreadable + report.ingest.failed
    for doc_id in plan.delete:
        try:
            client.request(
                "DELETE",
                f"/v1/collections/{quote(collection, safe='')}/documents/{quote(doc_id, safe='')}",
                ok_missing=True,
            )
            report.deleted += 1
        except ClientError as exc:
            report.failed.append((doc_id, str(exc)))
    return plan, report


def watch(
    client: StackClient,
    collection: str,
    folders: list[Path],
    console: Console,
    interval_s: float,
    cycles: int = 0,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Sync now, then every `interval_s` while files change; `cycles` > 0 stops after that many passes
    (0: until Ctrl-C). Returns the number of failures of the last pass."""
    hashes, done, failures = HashCache(), 0, 0
    while True:
        plan, report = sync_once(client, collection, folders, console, apply=True, hashes=hashes)
        done += 1
        stamp = time.strftime("%H:%M:%S")
        if report is not None:
            failures = len(report.failed)
            console.print(
                f"[{stamp}] {collection}: {report.ingest.sent} ingested ({report.ingest.chunks} chunks), "
                f"{report.deleted} deleted, {plan.unchanged} unchanged, {failures} failed",
                highlight=False,
            )
            for source, problem in report.failed:
                console.print(f"[red]failed[/red] {source}: {problem}", highlight=False)
        elif done == 1:
            console.print(
                f"[{stamp}] {collection}: in sync ({plan.unchanged} documents); watching {interval_s:g}s",
                highlight=False,
            )
        if cycles and done >= cycles:
            return failures
        sleep(interval_s)
