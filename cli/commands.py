"""The client commands on the `poolserve` app: ingest, query, collections, tenants (cli/main.py
registers them). Tenant keys come from $POOLSERVE_API_KEY, the admin key from $POOLSERVE_ADMIN_KEY,
either from --key-file instead; never from the command line, where shell history would keep it."""

from __future__ import annotations

import contextlib
from pathlib import Path
from urllib.parse import quote

import typer
from rich.console import Console
from rich.table import Table

from cli.client import ADMIN_KEY_ENV, API_KEY_ENV, DEFAULT_URL, URL_ENV, ClientError, StackClient, resolve_key
from cli.files import walk
from cli.ingest import ingest_files
from cli.sync import sync_once, watch
from system.private_files import open_private

collections_app = typer.Typer(
    help="The tenant's collections: list (no subcommand) or remove one.", invoke_without_command=True
)
tenants_app = typer.Typer(
    help="Tenants, their keys and usage (the admin API; needs the admin key).", no_args_is_help=True
)


def _url():
    return typer.Option(DEFAULT_URL, "--base-url", envvar=URL_ENV, help="The gateway's address.")


def _key_file(admin: bool):
    env = ADMIN_KEY_ENV if admin else API_KEY_ENV
    return typer.Option(None, "--key-file", help=f"A file holding the key; default ${env}.", exists=False)


def _client(base_url: str, key_file: Path | None, admin: bool) -> StackClient:
    return StackClient(base_url, resolve_key(key_file, ADMIN_KEY_ENV if admin else API_KEY_ENV))


def _fail(exc: ClientError) -> typer.Exit:
    Console(stderr=True).print(f"[red]error:[/red] {exc}", highlight=False)
    return typer.Exit(1)


def ingest(
    paths: list[Path] = typer.Argument(..., help="Files and folders (walked recursively)."),
    collection: str = typer.Option(..., "--collection", "-c", help="The collection to load into."),
    sync: bool = typer.Option(
        False,
        "--sync",
        help="Make the collection equal to the folders: also delete "
        "documents whose files are gone. Shows what it would do; --yes does it.",
    ),
    yes: bool = typer.Option(False, "--yes", "-y", help="With --sync: carry the sync out."),
    base_url: str = _url(),
    key_file: Path | None = _key_file(False),
) -> None:
    """Load text, Markdown, HTML, XHTML, PDF, DOCX and PPTX files into a collection, with progress. Unchanged
    files (same content hash in the stored document's metadata) are skipped; a failing file is reported and the
    rest go on. Files of 1 MiB and more go as ingest jobs."""
    console = Console(stderr=True)
    if sync:
        return _sync(paths, collection, yes, base_url, key_file, console)
    files, missing = walk(paths)
    for path in missing:
        console.print(f"[red]failed[/red] {path}: no such file or folder")
    try:
        with _client(base_url, key_file, admin=False) as client:
            report = ingest_files(client, collection, files, console)
    except ClientError as exc:
        raise _fail(exc) from None
    typer.echo(
        f"{report.sent} files ingested ({report.chunks} chunks, {report.chunks_per_s:.1f} chunks/s), "
        f"{report.skipped} unchanged and skipped, {len(report.failed) + len(missing)} failed"
    )
    if report.failed or missing:
        raise typer.Exit(1)


def _sync(
    paths: list[Path], collection: str, yes: bool, base_url: str, key_file: Path | None, console: Console
) -> None:
    missing = [p for p in paths if not p.exists()]
    if missing:  # a folder that is not there would delete everything it held
        for path in missing:
            console.print(f"[red]failed[/red] {path}: no such file or folder")
        raise typer.Exit(1)
    try:
        with _client(base_url, key_file, admin=False) as client:
            plan, report = sync_once(client, collection, paths, console, apply=yes)
    except ClientError as exc:
        raise _fail(exc) from None
    if report is None:
        typer.echo(
            f"{collection}: {plan.summary()}"
            + ("" if not plan.changes or yes else "; nothing changed: run again with --yes to sync")
        )
        for doc_id in plan.delete:
            typer.echo(f"  would delete {doc_id}")
        return
    typer.echo(
        f"{collection}: {report.ingest.sent} ingested ({report.ingest.chunks} chunks), {report.deleted} "
        f"deleted, {plan.unchanged} unchanged, {len(report.failed)} failed"
    )
    if report.failed:
        raise typer.Exit(1)


def watch_folder(
    paths: list[Path] = typer.Argument(..., help="Folders (and files) to keep the collection equal to."),
    collection: str = typer.Option(..., "--collection", "-c", help="The collection to keep in sync."),
    interval: float = typer.Option(5.0, "--interval", min=0.5, help="Seconds between looks at the files."),
    cycles: int = typer.Option(0, "--cycles", min=0, help="Stop after this many passes (0: until Ctrl-C)."),
    base_url: str = _url(),
    key_file: Path | None = _key_file(False),
) -> None:
    """Keep a collection equal to folders: sync now (adds, replacements and deletions, as `ingest --sync --yes`),
    then again whenever a file is added, changed or removed. Unchanged files are not read again."""
    console = Console(stderr=True)
    missing = [p for p in paths if not p.exists()]
    if missing:
        console.print(f"[red]error:[/red] no such file or folder: {', '.join(map(str, missing))}")
        raise typer.Exit(1)
    try:
        with _client(base_url, key_file, admin=False) as client:
            failures = watch(client, collection, paths, console, interval, cycles)
    except ClientError as exc:
        raise _fail(exc) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None
    if failures:
        raise typer.Exit(1)


def query(
    collection: str = typer.Argument(..., help="The collection to ask."),
    question: str = typer.Argument(..., help="The question."),
    top_k: int | None = typer.Option(None, "--top-k", min=1, help="Passages to retrieve."),
    model: str | None = typer.Option(None, "--model", help="Chat model; default the gateway's."),
    base_url: str = _url(),
    key_file: Path | None = _key_file(False),
) -> None:
    """Ask a collection: the answer, then a table of the passages it was given (POST /v1/rag/query)."""
    body = {"collection": collection, "question": question, "top_k": top_k, "model": model}
    try:
        with _client(base_url, key_file, admin=False) as client:
            result = client.request("POST", "/v1/rag/query", json={k: v for k, v in body.items() if v is not None})
    except ClientError as exc:
        raise _fail(exc) from None
    console = Console()
    console.print(result["answer"], highlight=False)
    table = Table(
        title="citations" + (" (below the score threshold: not answered from them)" if result.get("refused") else "")
    )
    for column in ("#", "document", "chunk", "score", "source", "text"):
        table.add_column(column, overflow="fold")
    for i, cited in enumerate(result.get("citations", []), 1):
        text = " ".join(cited["text"].split())
        table.add_row(
            str(i),
            cited["document_id"],
            cited["chunk_id"],
            f"{cited['score']:.3f}",
            str(cited.get("metadata", {}).get("source", "")),
            text[:160] + ("..." if len(text) > 160 else ""),
        )
    console.print(table)


@collections_app.callback()
def collections(ctx: typer.Context, base_url: str = _url(), key_file: Path | None = _key_file(False)) -> None:
    """List the collections of the key's tenant with their document and chunk counts."""
    ctx.obj = (base_url, key_file)
    if ctx.invoked_subcommand is not None:
        return
    try:
        with _client(base_url, key_file, admin=False) as client:
            listing = client.request("GET", "/v1/collections")
    except ClientError as exc:
        raise _fail(exc) from None
    table = Table(title="collections")
    for column in ("collection", "documents", "chunks", "created"):
        table.add_column(column, justify="left" if column == "collection" else "right")
    for c in listing["data"]:
        table.add_row(c["name"], str(c["documents"]), str(c["chunks"]), str(c.get("created_at", "")))
    Console().print(table)


@collections_app.command("rm")
def collections_rm(
    ctx: typer.Context,
    collection: str = typer.Argument(...),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
) -> None:
    """Delete a collection and every document in it."""
    base_url, key_file = ctx.obj
    if not yes:
        typer.confirm(f"Delete collection {collection!r} and all its documents?", abort=True)
    try:
        with _client(base_url, key_file, admin=False) as client:
            client.request("DELETE", f"/v1/collections/{quote(collection, safe='')}")
    except ClientError as exc:
        raise _fail(exc) from None
    typer.echo(f"deleted collection {collection}")


def _admin(ctx: typer.Context):
    base_url, key_file = ctx.obj
    return _client(base_url, key_file, admin=True)


@tenants_app.callback()
def tenants(ctx: typer.Context, base_url: str = _url(), key_file: Path | None = _key_file(True)) -> None:
    ctx.obj = (base_url, key_file)


class _KeyFile:
    """--save-key's open file; `written` once a key is in it (from then on it is never removed)."""

    def __init__(self, path: Path, handle) -> None:
        self.path, self.handle, self.written = path, handle, False

    def write(self, key: str) -> None:
        self.handle.write(key + "\n")
        self.handle.flush()
        self.written = True


@contextlib.contextmanager
def _key_destination(save_key: Path | None):
    """--save-key's file, created (exclusively, mode 0600) before the server makes the key: a file that
    already exists (or a folder that cannot hold it) fails here, not after a valid key was created with
    nowhere to go. Removed again if no key was written into it. None: the key goes to stdout."""
    if save_key is None:
        yield None
        return
    try:
        handle = open_private(save_key, exclusive=True)
    except OSError as exc:
        typer.echo(f"cannot create {save_key} for the key: {exc.strerror}; no key was created", err=True)
        raise typer.Exit(1) from None
    destination = _KeyFile(save_key, handle)
    try:
        yield destination
    finally:
        destination.handle.close()
        if not destination.written:
            save_key.unlink(missing_ok=True)


def _print_key(tenant: str, key: str, destination: _KeyFile | None) -> None:
    """A new key goes to stdout once (or only into --save-key's file, mode 0600); it is never logged."""
    if destination is None:
        typer.echo(f"API key for {tenant} (shown once; store it now): {key}")
        return
    destination.write(key)
    typer.echo(f"API key for {tenant} written to {destination.path} (mode 0600)")


SAVE_KEY_HELP = "Write the new key to this file (created, mode 0600) instead of printing it."


@tenants_app.command("add")
def tenants_add(
    ctx: typer.Context,
    name: str = typer.Argument(...),
    model: list[str] | None = typer.Option(None, "--model", help="A model it may use (repeat); default all."),
    rpm: int | None = typer.Option(None, "--rpm", min=1),
    tpm: int | None = typer.Option(None, "--tpm", min=1),
    max_concurrency: int | None = typer.Option(None, "--max-concurrency", min=1),
    save_key: Path | None = typer.Option(None, "--save-key", help=SAVE_KEY_HELP),
) -> None:
    """Create a tenant with its first API key."""
    body = {"name": name, "models": model or None, "rpm": rpm, "tpm": tpm, "max_concurrency": max_concurrency}
    with _key_destination(save_key) as destination:
        try:
            with _admin(ctx) as client:
                created = client.request("POST", "/admin/tenants", json=body)
        except ClientError as exc:
            raise _fail(exc) from None
        _print_key(name, created["api_key"], destination)


def _limit(value) -> str:
    return "unlimited" if value is None else str(value)


@tenants_app.command("list")
def tenants_list(ctx: typer.Context) -> None:
    """Every tenant with its limits."""
    try:
        with _admin(ctx) as client:
            listing = client.request("GET", "/admin/tenants")
    except ClientError as exc:
        raise _fail(exc) from None
    table = Table(title="tenants")
    for column in ("tenant", "models", "rpm", "tpm", "concurrency", "created"):
        table.add_column(column)
    for t in listing["data"]:
        table.add_row(
            t["name"],
            ", ".join(t["models"]) if t["models"] is not None else "all",
            _limit(t["rpm"]),
            _limit(t["tpm"]),
            _limit(t["max_concurrency"]),
            t["created_at"],
        )
    Console().print(table)


@tenants_app.command("rm")
def tenants_rm(
    ctx: typer.Context,
    name: str = typer.Argument(...),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask."),
) -> None:
    """Delete a tenant, its keys and its collections (its usage rows are kept for accounting)."""
    if not yes:
        typer.confirm(f"Delete tenant {name!r}, its keys and its collections?", abort=True)
    try:
        with _admin(ctx) as client:
            client.request("DELETE", f"/admin/tenants/{quote(name, safe='')}")
    except ClientError as exc:
        raise _fail(exc) from None
    typer.echo(f"deleted tenant {name}")


@tenants_app.command("usage")
def tenants_usage(ctx: typer.Context, name: str = typer.Argument(...)) -> None:
    """Requests and tokens per day and model, and today's 429s."""
    try:
        with _admin(ctx) as client:
            usage = client.request("GET", f"/admin/tenants/{quote(name, safe='')}/usage")
    except ClientError as exc:
        raise _fail(exc) from None
    table = Table(title=f"usage of {name}")
    for column in ("day", "model", "requests", "prompt tokens", "completion tokens"):
        table.add_column(column, justify="left" if column in ("day", "model") else "right")
    for row in usage["usage"]:
        table.add_row(
            row["day"], row["model"], str(row["requests"]), str(row["prompt_tokens"]), str(row["completion_tokens"])
        )
    console = Console()
    console.print(table)
    rejected = usage.get("rejected_today") or {}
    console.print(
        f"429s today: {sum(rejected.values())}"
        + (f" ({', '.join(f'{k} {v}' for k, v in sorted(rejected.items()))})" if rejected else "")
    )


@tenants_app.command("keys")
def tenants_keys(
    ctx: typer.Context,
    name: str = typer.Argument(...),
    create: bool = typer.Option(False, "--create", help="Make another key (rotation)."),
    revoke: str | None = typer.Option(None, "--revoke", help="Revoke the key with this key id."),
    save_key: Path | None = typer.Option(None, "--save-key", help=SAVE_KEY_HELP),
) -> None:
    """List a tenant's keys (ids only; secrets are never stored), or --create / --revoke one."""
    tenant = quote(name, safe="")
    with _key_destination(save_key if create else None) as destination:
        try:
            with _admin(ctx) as client:
                if create:  # stored before anything else can fail
                    _print_key(name, client.request("POST", f"/admin/tenants/{tenant}/keys")["api_key"], destination)
                elif revoke:
                    client.request("DELETE", f"/admin/tenants/{tenant}/keys/{quote(revoke, safe='')}")
                listing = client.request("GET", f"/admin/tenants/{tenant}/keys")
        except ClientError as exc:
            raise _fail(exc) from None
    if revoke:
        typer.echo(f"revoked key {revoke}")
    table = Table(title=f"keys of {name}")
    for column in ("key id", "origin", "created"):
        table.add_column(column)
    for key in listing["data"]:
        table.add_row(key["key_id"], key["origin"], key["created_at"])
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.command()(ingest)
    app.command("watch")(watch_folder)
    app.command()(query)
    app.add_typer(collections_app, name="collections")
    app.add_typer(tenants_app, name="tenants")
