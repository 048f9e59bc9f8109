"""The pure parts of `poolserve ingest` and friends: walking, ids, hashes, skip logic, keys."""

from __future__ import annotations

import pytest

from cli.client import ClientError, resolve_key
from cli.files import HASH_KEY, MAX_ID_LEN, content_hash, document_id, unchanged, walk
from rag.documents.ids import validate_document_id


def test_walk_finds_supported_files_recursively_skips_hidden_and_lists_missing(tmp_path):
    docs = tmp_path / "docs"
    (docs / "guides").mkdir(parents=True)
    (docs / ".git").mkdir()
    for name in ("a.md", "guides/b.HTML", "guides/c.txt", "image.png", ".hidden.md", ".git/d.md"):
        (docs / name).write_text("x")
    (tmp_path / "notes.odt").write_text("x")
    files, missing = walk([docs, tmp_path / "notes.odt", docs / "a.md", tmp_path / "nope"])
    assert [(f.source, f.content_type) for f in files] == [
        ("docs/a.md", "text/markdown"),
        ("docs/guides/b.HTML", "text/html"),
        ("docs/guides/c.txt", "text/plain"),
        ("notes.odt", None),
    ]  # a file named directly is listed (and reported) even of an unsupported type
    assert missing == [tmp_path / "nope"]


def test_document_ids_are_valid_stable_and_distinct():
    sources = [
        "docs/guides/b.md",
        "docs/guides b.md",
        "../x..y.md",
        "_odd.md",
        "é/ü.txt",
        "d/" + "x" * 300 + ".md",
        "d/" + "x" * 300 + ".txt",
    ]
    ids = [document_id(s) for s in sources]
    for doc_id in ids:
        assert validate_document_id(doc_id) == doc_id and len(doc_id) <= MAX_ID_LEN
    assert ids[0] == "docs:guides:b.md" and document_id("docs/guides/b.md") == ids[0]
    assert len(set(ids)) == len(ids)


def test_unchanged_only_when_the_same_id_holds_the_same_hash():
    digest = content_hash(b"hello")
    assert digest == content_hash(b"hello") != content_hash(b"hello!")
    stored = {"a.md": {HASH_KEY: digest, "source": "a.md"}, "b.md": {}}
    assert unchanged("a.md", digest, stored)
    assert not unchanged("a.md", content_hash(b"changed"), stored)
    assert not unchanged("b.md", digest, stored) and not unchanged("new.md", digest, stored)


def test_key_comes_from_the_key_file_else_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("POOLSERVE_API_KEY", "from-env")
    assert resolve_key(None, "POOLSERVE_API_KEY") == "from-env"
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    assert resolve_key(key_file, "POOLSERVE_API_KEY") == "from-file"
    monkeypatch.delenv("POOLSERVE_API_KEY")
    with pytest.raises(ClientError, match="set POOLSERVE_API_KEY or pass --key-file"):
        resolve_key(None, "POOLSERVE_API_KEY")
    with pytest.raises(ClientError, match="cannot read the key file"):
        resolve_key(tmp_path / "missing", "POOLSERVE_API_KEY")


class _RecordingAdmin:
    """Stands in for the admin API client: records what the CLI asked the server for."""

    def __init__(self, calls: list):
        self.calls = calls

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def request(self, method, path, json=None):
        self.calls.append((method, path))
        return {"api_key": "sk-new-key", "data": []}


def _run_tenants(monkeypatch, args):
    import typer
    from typer.testing import CliRunner

    import cli.commands as commands

    calls: list = []
    monkeypatch.setattr(commands, "_admin", lambda ctx: _RecordingAdmin(calls))
    app = typer.Typer()
    commands.register(app)
    return CliRunner().invoke(app, ["tenants", *args]), calls


def test_save_key_refuses_an_existing_file_before_any_key_is_created(tmp_path, monkeypatch):
    existing = tmp_path / "acme.key"
    existing.write_text("an older key\n")
    for args in (
        ["add", "acme", "--save-key", str(existing)],
        ["keys", "acme", "--create", "--save-key", str(existing)],
    ):
        result, calls = _run_tenants(monkeypatch, args)
        assert result.exit_code == 1 and calls == []  # the server was never asked: no orphaned key
        assert existing.read_text() == "an older key\n"


def test_save_key_writes_the_new_key_to_a_new_private_file(tmp_path, monkeypatch):
    target = tmp_path / "acme.key"
    result, calls = _run_tenants(monkeypatch, ["add", "acme", "--save-key", str(target)])
    assert result.exit_code == 0 and calls == [("POST", "/admin/tenants")]
    assert target.read_text() == "sk-new-key\n" and (target.stat().st_mode & 0o777) == 0o600


class _JobClient:
    """A StackClient stand-in that answers the job routes from a script of GET answers."""

    def __init__(self, answers: list[dict], interrupt_at: int | None = None):
        self.answers, self.calls, self.interrupt_at = answers, [], interrupt_at

    def request(self, method, path, ok_missing=False, **kwargs):
        self.calls.append((method, path, kwargs.get("json")))
        if method == "POST":
            return {"id": "ingest_1", "status": "in_progress", "counts": {"chunks_embedded": 0}}
        if method == "DELETE":
            return {"id": "ingest_1", "status": "cancelling"}
        if self.interrupt_at is not None and len(self.calls) > self.interrupt_at:
            raise KeyboardInterrupt
        return self.answers.pop(0)


def _follow(client):
    from cli.ingest import IngestReport, _ingest_as_job

    report, shown = IngestReport(), []
    problem = _ingest_as_job(
        client, "/v1/collections/kb/documents", {"id": "big"}, report, shown.append, sleep=lambda s: None
    )
    return problem, report, shown


def test_a_large_file_goes_as_a_job_and_is_followed_to_completion():
    running = {"id": "ingest_1", "status": "in_progress", "counts": {"chunks_embedded": 300}}
    done = {"id": "ingest_1", "status": "completed", "counts": {"chunks_embedded": 600}, "result": {"chunks": 600}}
    client = _JobClient([running, done])
    problem, report, shown = _follow(client)
    assert problem is None and (report.sent, report.chunks) == (1, 600) and shown == [0, 300]
    assert client.calls[0] == ("POST", "/v1/collections/kb/documents", {"documents": [{"id": "big"}], "async": True})
    assert [c[:2] for c in client.calls[1:]] == [("GET", "/v1/ingest/jobs/ingest_1")] * 2


def test_a_failed_job_is_reported_with_its_error():
    failed = {
        "id": "ingest_1",
        "status": "failed",
        "counts": {"chunks_embedded": 0},
        "error": {"status": 413, "message": "over capacity"},
    }
    problem, report, _ = _follow(_JobClient([failed]))
    assert problem == "job ingest_1 failed: 413 over capacity" and report.sent == 0


def test_ctrl_c_cancels_the_job_on_the_server():
    client = _JobClient([], interrupt_at=1)
    with pytest.raises(KeyboardInterrupt):
        _follow(client)
    assert client.calls[-1][:2] == ("DELETE", "/v1/ingest/jobs/ingest_1")
