"""`poolserve ingest|query|collections|tenants` against the real stack, through typer's CliRunner with
the environment a user would set (POOLSERVE_URL, POOLSERVE_ADMIN_KEY, then the new tenant's key file)."""

from __future__ import annotations

import re
import stat
import uuid

import httpx
import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.integration.conftest import ADMIN_KEY

KEY_PATTERN = re.compile(r"ps_[0-9a-f]{12}_[A-Za-z0-9_-]+")


@pytest.fixture()
def cli(stack):
    runner = CliRunner()
    env = {"POOLSERVE_URL": stack.url, "POOLSERVE_ADMIN_KEY": ADMIN_KEY, "POOLSERVE_API_KEY": "", "COLUMNS": "200"}

    def run(*args: str, check: int | None = 0):
        result = runner.invoke(app, list(args), env=env, catch_exceptions=False)
        if check is not None:
            assert result.exit_code == check, result.output
        return result

    return run


@pytest.fixture()
def tenant(cli, tmp_path):
    name = f"cli-{uuid.uuid4().hex[:6]}"
    key_file = tmp_path / "tenant.key"
    added = cli("tenants", "add", name, "--rpm", "600", "--save-key", str(key_file))
    assert KEY_PATTERN.search(added.output) is None  # written to the file, not printed
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and KEY_PATTERN.fullmatch(key_file.read_text().strip())
    yield name, key_file
    cli("tenants", "rm", name, "--yes", check=None)


def _folder(root):
    docs = root / "docs"
    (docs / "policies").mkdir(parents=True)
    (docs / "leave.md").write_text("# Leave\n\nAnnual leave is 25 days a year. Up to 5 days carry over.\n")
    (docs / "policies" / "travel.html").write_text(
        "<html><head><title>Travel</title></head><body><h1>Travel</h1><p>Trains for trips under 600 km; "
        "flights need a manager's approval.</p><script>ignored()</script></body></html>"
    )
    (docs / "policies" / "laptops.txt").write_text("Laptops are replaced every four years.\n")
    (docs / "logo.png").write_bytes(b"\x89PNG not text")  # not a supported type: not walked
    broken = root / "broken.txt"
    broken.write_bytes(b"caf\xe9 latin-1, not UTF-8")
    return docs, broken


def test_ingest_a_folder_skip_unchanged_query_and_remove(cli, tenant, tmp_path, stack):
    name, key_file = tenant
    docs, broken = _folder(tmp_path)
    key = ("--key-file", str(key_file))

    first = cli("ingest", str(docs), str(broken), "--collection", "policies", *key, check=1)
    assert "chunks/s" in first.output and "files" in first.output  # the progress bar's columns
    assert re.search(r"failed.*broken\.txt: not UTF-8 text", first.output)  # reported; the rest went on
    assert "3 files ingested" in first.output and "1 failed" in first.output

    again = cli("ingest", str(docs), "--collection", "policies", *key)
    assert "0 files ingested" in again.output and "3 unchanged and skipped" in again.output
    (docs / "leave.md").write_text("# Leave\n\nAnnual leave is 27 days a year. Up to 5 days carry over.\n")
    changed = cli("ingest", str(docs), "--collection", "policies", *key)
    assert "1 files ingested" in changed.output and "2 unchanged and skipped" in changed.output

    with httpx.Client(
        base_url=stack.url, headers={"Authorization": f"Bearer {key_file.read_text().strip()}"}, timeout=60
    ) as http:
        stored = {d["id"]: d for d in http.get("/v1/collections/policies/documents").json()["data"]}
    assert set(stored) == {"docs:leave.md", "docs:policies:travel.html", "docs:policies:laptops.txt"}
    assert stored["docs:policies:travel.html"]["metadata"]["source"] == "docs/policies/travel.html"
    assert len(stored["docs:leave.md"]["metadata"]["sha256"]) == 64

    listed = cli("collections", *key)
    assert re.search(r"policies\s.*\b3\b", listed.output)
    answer = cli("query", "policies", "How many days of annual leave are there?", "--top-k", "2", *key)
    assert "citations" in answer.output and "docs:leave.md" in answer.output

    cli("collections", *key, "rm", "policies", "--yes")
    assert "policies" not in cli("collections", *key).output
    refused = cli("collections", *key, "rm", "no..such", "--yes", check=1)
    assert "400" in refused.output and "collection name" in refused.output


def test_sync_makes_the_collection_equal_to_the_folder_and_watch_follows_it(cli, tenant, tmp_path, stack):
    name, key_file = tenant
    docs, _ = _folder(tmp_path)
    key = ("--key-file", str(key_file))
    cli("ingest", str(docs), "--collection", "synced", *key)
    (docs / "policies" / "laptops.txt").unlink()
    (docs / "leave.md").write_text("# Leave\n\nAnnual leave is 30 days a year.\n")
    (docs / "parking.md").write_text("# Parking\n\nVisitor parking is behind building C.\n")

    dry = cli("ingest", str(docs), "--collection", "synced", "--sync", *key)
    assert "1 to add, 1 to replace, 1 to delete, 1 unchanged" in dry.output and "--yes" in dry.output
    assert "would delete docs:policies:laptops.txt" in dry.output
    done = cli("ingest", str(docs), "--collection", "synced", "--sync", "--yes", *key)
    assert "2 ingested" in done.output and "1 deleted" in done.output and "0 failed" in done.output

    def stored() -> dict:
        with httpx.Client(
            base_url=stack.url, headers={"Authorization": f"Bearer {key_file.read_text().strip()}"}, timeout=60
        ) as http:
            return {d["id"]: d["metadata"] for d in http.get("/v1/collections/synced/documents").json()["data"]}

    assert set(stored()) == {"docs:leave.md", "docs:parking.md", "docs:policies:travel.html"}
    again = cli("ingest", str(docs), "--collection", "synced", "--sync", "--yes", *key)
    assert "0 to add, 0 to replace, 0 to delete, 3 unchanged" in again.output

    (docs / "parking.md").unlink()
    watched = cli("watch", str(docs), "--collection", "synced", "--cycles", "1", "--interval", "0.5", *key)
    assert "1 deleted" in watched.output
    assert set(stored()) == {"docs:leave.md", "docs:policies:travel.html"}
    missing = cli("ingest", str(tmp_path / "nope"), "--collection", "synced", "--sync", "--yes", *key, check=1)
    assert "no such file or folder" in missing.output and len(stored()) == 2  # nothing deleted for a typo


def test_tenants_list_usage_keys_and_rm(cli, tenant, stack):
    name, key_file = tenant
    assert name in cli("tenants", "list").output
    created = cli("tenants", "keys", name, "--create")
    new_key = KEY_PATTERN.search(created.output).group(0)  # printed once, on creation
    key_id = new_key.split("_")[1]
    assert httpx.get(f"{stack.url}/v1/models", headers={"Authorization": f"Bearer {new_key}"}).status_code == 200
    listing = cli("tenants", "keys", name, "--revoke", key_id)
    assert f"revoked key {key_id}" in listing.output and KEY_PATTERN.search(listing.output) is None
    assert httpx.get(f"{stack.url}/v1/models", headers={"Authorization": f"Bearer {new_key}"}).status_code == 401
    usage = cli("tenants", "usage", name)
    assert f"usage of {name}" in usage.output and "429s today: 0" in usage.output
    cli("tenants", "rm", name, "--yes")
    assert name not in cli("tenants", "list").output
    missing = cli("tenants", "usage", name, check=1)
    assert "404" in missing.output


def test_cli_without_a_key_or_stack_says_so(cli):
    no_key = cli("collections", check=1)
    assert "set POOLSERVE_API_KEY or pass --key-file" in no_key.output
    unreachable = cli("tenants", "--base-url", "http://127.0.0.1:9", "list", check=1)
    assert "cannot reach http://127.0.0.1:9" in unreachable.output
