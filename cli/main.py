"""`poolserve` command line: plan, render, up/down, status, stress; and the client commands of cli/
(ingest, query, collections, tenants) that talk to a running stack."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import typer
import yaml
from rich.console import Console
from rich.table import Table

from cli.commands import register as register_client_commands
from cli.plan_on_demand import print_on_demand
from planner.gpu import engine_placement
from planner.plan import Plan, PlanError, build_plan
from planner.profile import load_profile, parse_size
from planner.units import gib

app = typer.Typer(
    help="Plan, render and check poolserve's unified memory pool; load and ask knowledge bases, manage tenants.",
    no_args_is_help=True,
)

# One profile argument for every command: the command line, else $POOLSERVE_PROFILE, else the CPU default.
PROFILE_ENV = "POOLSERVE_PROFILE"
DEFAULT_PROFILE = Path("configs/cpu-tiny.yaml")
PROFILE_HELP = f"Profile YAML (or ${PROFILE_ENV}); default {DEFAULT_PROFILE}."


def profile_argument():
    return typer.Argument(DEFAULT_PROFILE, envvar=PROFILE_ENV, help=PROFILE_HELP, show_default=False)


def profile_option():
    return typer.Option(
        None, "--profile", "-p", envvar=PROFILE_ENV, help=PROFILE_HELP + " Overrides the profile serve.yaml names."
    )


def _plan_or_exit(profile: Path, pool: str | None, console: Console) -> tuple[Plan, object]:
    try:
        prof = load_profile(profile)
        return build_plan(prof, parse_size(pool) if pool else None), prof
    except (PlanError, ValueError, FileNotFoundError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc


def plan_json(plan: Plan) -> dict:
    data = plan.model_dump(exclude_none=True)
    data["replicas"] = [
        {
            k: r[k]
            for k in (
                "name",
                "kind",
                "planned_bytes",
                "growth_bytes",
                "breakdown",
                "vllm",
                "ray_actor_options",
                "env",
                "start_order",
            )
            if k in r
        }
        for r in data["replicas"]
    ]
    return data


def _print_nodes(plan: Plan, console: Console) -> None:
    """A plan of several nodes: one table per node (its replicas and shares, Ray there, its pool)."""
    by_name = {r.name: r for r in [*plan.replicas, *plan.shares]}
    for p in plan.pools:
        role = "head" if p.head else "worker"
        table = Table(
            title=f"poolserve plan: {plan.profile}, node {p.name} ({role}; ray start --resources "
            f"{json.dumps(p.ray_resources)})"
        )
        table.add_column("item")
        table.add_column("bytes", justify="right")
        table.add_column("size", justify="right")
        for name in p.replicas:
            r = by_name[name]
            table.add_row(f"[bold]{r.name}[/bold] (start {r.start_order})", f"{r.pool_bytes:,}", gib(r.pool_bytes))
            for line, value in r.breakdown.items():
                table.add_row(f"  {line}", f"{value:,}", gib(value))
        table.add_row("[bold]ray[/bold] (this node's processes + object store)", f"{p.ray_bytes:,}", gib(p.ray_bytes))
        for line, value in p.ray_breakdown.items():
            table.add_row(f"  {line}", f"{value:,}", gib(value))
        for label, value in (
            ("pool total", p.total_bytes),
            ("reserve", p.reserve_bytes),
            ("free to plan", p.free_bytes),
            ("headroom", p.headroom_bytes),
            ("headroom at start", p.start_headroom_bytes),
            ("smallest pool", p.needed_bytes),
        ):
            table.add_row(f"[bold]{label}[/bold]", f"{value:,}", gib(value))
        console.print(table)
        for a in p.admission:
            console.print(
                f"  {p.name} start {a.start_order} {a.name}: {a.check}; {gib(a.requested_bytes)} of "
                f"{gib(a.free_before_bytes)} free at its turn",
                highlight=False,
            )
    for r in [*plan.replicas, *plan.shares]:
        console.print(
            f"{r.name} on {r.node}: ray_actor_options {r.ray_actor_options.as_dict()}", highlight=False, markup=False
        )
    for name in plan.engines:
        console.print(
            f"{name} vLLM engine_kwargs: {json.dumps(plan.replica(name).vllm.as_dict())}", highlight=False, markup=False
        )
    for note in plan.notes:
        console.print(f"note: {note}", highlight=False, markup=False)


def _print_plan(plan: Plan, console: Console) -> None:
    if len(plan.pools) > 1:
        _print_nodes(plan, console)
        return
    table = Table(title=f"poolserve plan: {plan.profile} on pool {plan.pool.name}", show_lines=False)
    table.add_column("item")
    table.add_column("bytes", justify="right")
    table.add_column("size", justify="right")
    for r in sorted(plan.replicas, key=lambda r: r.start_order):
        copies = f" x{r.num_replicas}" if r.num_replicas > 1 else ""
        table.add_row(f"[bold]{r.name}[/bold]{copies} (start {r.start_order})", f"{r.pool_bytes:,}", gib(r.pool_bytes))
        for line, value in r.breakdown.items():
            table.add_row(f"  {line}", f"{value:,}", gib(value))
    table.add_row(
        "[bold]ray[/bold] (own processes + object store)", f"{plan.pool.ray_bytes:,}", gib(plan.pool.ray_bytes)
    )
    for line, value in plan.ray.breakdown.items():
        table.add_row(f"  {line}", f"{value:,}", gib(value))
    for line, value in plan.page_cache.items():
        table.add_row(line, f"{value:,}", gib(value))
    p = plan.pool
    for label, value in (
        ("pool total", p.total_bytes),
        ("reserve (OS, page cache, runtime)", p.reserve_bytes),
        ("free to plan (total - reserve)", p.free_bytes),
        ("planned (replicas + ray + page cache)", p.planned_bytes + p.ray_bytes + p.page_cache_bytes),
        ("headroom", p.headroom_bytes),
    ):
        table.add_row(f"[bold]{label}[/bold]", f"{value:,}", gib(value))
    for line, value in plan.start_peak.items():
        table.add_row(f"  {line} (while it starts)", f"{value:,}", gib(value))
    if plan.start_peak:
        table.add_row("[bold]headroom at start[/bold]", f"{p.start_headroom_bytes:,}", gib(p.start_headroom_bytes))
    table.add_row("[bold]smallest pool (--pool / POOL=)[/bold]", f"{p.needed_bytes:,}", gib(p.needed_bytes))
    console.print(table)
    for name, c in (plan.engines or {"chat": plan.chat}).items():
        console.print(
            f"{name}: {c.kv_bytes_per_token:,} B/token KV (target {c.target_kv_bytes_per_token:,}, indexer "
            f"{c.indexer_bytes_per_token:,}, drafter {c.drafter_kv_bytes_per_token:,}); state "
            f"{c.state_bytes_per_sequence:,} B/sequence; block {c.block_size}; {c.num_blocks:,} blocks = "
            f"{c.kv_pool_tokens:,} tokens; max_num_seqs {c.max_num_seqs}; source {c.architecture_source}",
            highlight=False,
        )
        console.print(
            f"{name} vLLM engine_kwargs: {json.dumps(plan.replica(name).vllm.as_dict())}", highlight=False, markup=False
        )
    adm = Table(title="start order and admission")
    for col in (
        "#",
        "replica",
        "check",
        "requested",
        "free at its turn",
        "start peak",
        "headroom starting",
        "free if last",
    ):
        adm.add_column(col)
    for a in plan.admission:
        adm.add_row(
            str(a.start_order),
            a.name,
            a.check,
            gib(a.requested_bytes),
            gib(a.free_before_bytes),
            gib(a.start_peak_bytes),
            gib(a.start_headroom_bytes),
            gib(a.free_worst_bytes),
        )
    console.print(adm)
    print_on_demand(plan, console)  # issue 48: on-demand engines, when any
    console.print(
        f"threads: {plan.threads}; ray: object_store_memory {plan.ray.object_store_memory:,}, "
        f"include_dashboard {plan.ray.include_dashboard}, memory {plan.ray.memory:,}",
        highlight=False,
    )
    for r in plan.replicas:
        console.print(
            f"{r.name}: ray_actor_options {r.ray_actor_options.as_dict()} env {r.env}", highlight=False, markup=False
        )
    for note in plan.notes:
        console.print(f"note: {note}", highlight=False, markup=False)


@app.command()
def plan(
    profile: Path = profile_argument(),
    pool: str | None = typer.Option(None, "--pool", help="Pool size, e.g. 24GiB; overrides pools[0].total."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
) -> None:
    """Print the plan; a refused plan exits non-zero with the advice."""
    console = Console(width=140)
    result, _ = _plan_or_exit(profile, pool, console)
    if as_json:
        typer.echo(json.dumps(plan_json(result), indent=2))
    else:
        _print_plan(result, console)


def _chat_deployment(r) -> dict:
    """A chat replica as the app deploys it (planner.gpu.engine_placement, which deployments/chat.py uses):
    ray.serve.llm adds the replica actor's resources to the engine's bundle, and the actor runs in it."""
    actor, bundle = engine_placement(r.ray_actor_options)
    merged = {"GPU": 0, **bundle, "CPU": bundle["CPU"] + actor["num_cpus"], "memory": actor["memory"]}
    return {
        "name": f"PoolserveLLMServer:{r.name}",
        "num_replicas": r.num_replicas,
        "ray_actor_options": {**actor, "runtime_env": {"env_vars": dict(r.env)}},
        "placement_group_bundles": [merged],
        "placement_group_strategy": "PACK",
        **r.serve.deployment_options(),
    }


def serve_config(result: Plan, profile_path: Path) -> dict:
    deployments = []
    for r in sorted(result.replicas, key=lambda r: r.start_order):
        deployments.append(_chat_deployment(r) if r.kind == "chat" else {"name": r.name, **r.serve_options()})
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": 8000},
        "applications": [
            {
                "name": "poolserve",
                "route_prefix": "/",
                "import_path": "deployments.app:build_app",
                "args": {"profile": str(profile_path), "plan": result.model_dump(mode="json")},
                "deployments": deployments,
            }
        ],
    }


@app.command()
def render(
    profile: Path = profile_argument(),
    output: Path = typer.Option(..., "-o", "--output", help="Where to write the resolved Serve config."),
    pool: str | None = typer.Option(None, "--pool", help="Pool size override."),
) -> None:
    """Write the fully resolved Serve config (every number explicit) for review."""
    result, _ = _plan_or_exit(profile, pool, Console())
    header = (
        f"# Resolved by `poolserve render {profile}`: every number from the plan; `serve run` of this file\n"
        f"# deploys args.plan as it is (refused if the profile has changed since).\n"
        f"# Ray: object_store_memory={result.ray.object_store_memory} include_dashboard="
        f"{result.ray.include_dashboard} num_cpus={result.ray.num_cpus:g} memory={result.ray.memory}\n"
    )
    output.write_text(header + yaml.safe_dump(serve_config(result, profile.resolve()), sort_keys=False))
    typer.echo(f"wrote {output}")


def profile_from_serve_config(serve_config_path: Path, chosen: Path | None = None) -> Path:
    """The profile to run: the one chosen (--profile / $POOLSERVE_PROFILE), else the one a serve.yaml names
    (its first application's `args.profile`), else the CPU default; relative to the serve.yaml's folder."""
    config = yaml.safe_load(serve_config_path.read_text()) or {}
    named = ((config.get("applications") or [{}])[0].get("args") or {}).get("profile")
    profile = Path(chosen or named or DEFAULT_PROFILE)
    return profile if profile.is_absolute() else serve_config_path.resolve().parent / profile


@app.command()
def up(
    serve_config: Path = typer.Argument(Path("serve.yaml"), help="The Serve config (serve.yaml)."),
    profile: Path | None = profile_option(),
    pool: str | None = typer.Option(
        None, help="Run inside a memory cgroup of this size, e.g. 6GiB (the plan is made for it)."
    ),
    join: str | None = typer.Option(
        None,
        "--join",
        help="HEAD:PORT of a running head: start this machine as "
        "one more node of the profile's cluster (its pools: entry --node).",
    ),
    node: str | None = typer.Option(
        None, "--node", help="With --join: which of the profile's pools this machine is (default: the second)."
    ),
    token_file: Path | None = typer.Option(
        None,
        "--token-file",
        help="With --join: the head's Ray token, copied here (default: <state_dir>/ray-auth-token).",
    ),
    state_dir: Path | None = typer.Option(
        None,
        "--state-dir",
        help="With --join: this node's state dir (default: the profile's); two nodes on one machine need two.",
    ),
) -> None:
    """Run the stack in the foreground: a private Ray head with token auth, then `serve run`; with --join,
    one more node of a profile of several pools. Ctrl-C or SIGTERM stops it and every process it started
    (and no other)."""
    from stackctl.launcher import StackLayout, up as run_stack

    profile_path = profile_from_serve_config(serve_config, profile)
    result, prof = _plan_or_exit(profile_path, pool, Console(stderr=True))
    log = lambda m: typer.echo(f"poolserve: {m}", err=True)  # noqa: E731
    if join is not None:
        from stackctl.join import join as join_cluster

        if len(prof.pools) < 2:
            log(f"--join needs a profile of several pools; {profile_path} has one")
            raise typer.Exit(2)
        layout = StackLayout(state_dir or Path(prof.state_dir))
        raise typer.Exit(
            join_cluster(
                prof, result, node or prof.pools[1].name, join, token_file or layout.token_path, layout, log=log
            )
        )
    raise typer.Exit(
        run_stack(serve_config, prof, profile_path, result, pool_bytes=parse_size(pool) if pool else None, log=log)
    )


@app.command()
def preflight(
    profile: Path = profile_argument(),
    pool: str | None = typer.Option(None, "--pool", help="Pool size override (the cgroup to be made)."),
    node: str | None = typer.Option(
        None, "--node", help="A profile of several pools: the node this machine is (default: the first, the head)."
    ),
) -> None:
    """Compare the live pool (MemAvailable, page cache, a cgroup's use) with the plan, step by start
    step (with several pools, this node's replicas only). `poolserve up` runs it before every start.
    Exits 2 when the plan does not fit now."""
    from stackctl.cluster import node_plan
    from stackctl.preflight import biggest_other_processes, check, read_live

    result, prof = _plan_or_exit(profile, pool, Console(stderr=True))
    result = node_plan(result, node or prof.pools[0].name)
    outcome = check(result, read_live(None))
    if not outcome.ok:
        outcome = check(result, read_live(None), biggest_other_processes(set()))
    for line in outcome.lines:
        typer.echo(line)
    raise typer.Exit(0 if outcome.ok else 2)


@app.command()
def down(
    serve_config: Path = typer.Argument(Path("serve.yaml"), help="The Serve config (serve.yaml)."),
    profile: Path | None = profile_option(),
    state_dir: Path | None = typer.Option(
        None, "--state-dir", help="A node's state dir when it is not the profile's (`up --join --state-dir`)."
    ),
) -> None:
    """Stop the stack (or this node) of the state dir: only the processes it started, found by their marker."""
    from stackctl.launcher import StackLayout, down as stop_stack

    prof = load_profile(profile_from_serve_config(serve_config, profile))
    stop_stack(StackLayout(state_dir or Path(prof.state_dir)), log=lambda m: typer.echo(f"poolserve: {m}", err=True))


@app.command()
def status(
    url: str | None = typer.Option(
        None, "--url", help="Gateway base URL; default: the profile's gateway.host and gateway.port."
    ),
    profile: Path = typer.Option(DEFAULT_PROFILE, "--profile", "-p", envvar=PROFILE_ENV, help=PROFILE_HELP),
    admin_key: str = typer.Option(..., envvar="POOLSERVE_ADMIN_KEY", help="The gateway's admin key."),
    as_json: bool = typer.Option(False, "--json", help="Print the gateway's JSON."),
) -> None:
    """Planned vs measured bytes per replica, from the running gateway's /status."""
    if url is None:
        gateway = load_profile(profile).gateway
        url = f"http://{'127.0.0.1' if gateway.host in ('0.0.0.0', '::') else gateway.host}:{gateway.port}"
    target = url.rstrip("/") + "/status"
    try:
        response = httpx.get(target, timeout=30.0, headers={"Authorization": f"Bearer {admin_key}"})
        response.raise_for_status()
        data = response.json()
    except httpx.HTTPStatusError as exc:
        typer.echo(f"{target} answered {exc.response.status_code}: {exc.response.text[:200]}", err=True)
        raise typer.Exit(1) from exc
    except (httpx.HTTPError, ValueError) as exc:
        typer.echo(
            f"cannot read {target}: {exc.__class__.__name__}: {exc}. Is the stack running "
            "(make serve), and is --url the gateway's address?",
            err=True,
        )
        raise typer.Exit(1) from exc
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    table = Table(title=f"planned vs measured ({target})")
    # "at rest" leaves out what fills with use (index capacity, caches) and a batch's peak.
    for col in ("replica", "planned", "planned at rest", "measured", "error vs at rest", "anon", "file", "pids"):
        table.add_column(col, justify="right" if col != "replica" else "left")
    for r in data.get("replicas", []):
        planned, measured = int(r.get("planned_bytes") or 0), int(r.get("measured_bytes") or 0)
        # the retriever's: for what it holds now (its index and SQLite cache as filled), from /status
        at_rest = int(r.get("planned_for_contents_bytes") or r.get("planned_at_rest_bytes") or planned)
        error = f"{(measured - at_rest) / at_rest * 100:+.1f}%" if at_rest else "n/a"
        table.add_row(
            str(r.get("name")),
            gib(planned),
            gib(at_rest),
            gib(measured),
            error,
            gib(int(r.get("anon_bytes") or 0)),
            gib(int(r.get("file_bytes") or 0)),
            ",".join(str(p) for p in r.get("pids", [])),
        )
    Console(width=120).print(table)
    pool = data.get("pool")
    if pool:
        typer.echo(
            f"pool: {pool['state']}, {pool['used_bytes'] / 2**30:.2f} of {pool['limit_bytes'] / 2**30:.2f} GiB "
            f"in use ({pool['fraction']:.0%}; sheds ingestion at {pool['shed_ingest_at']:.0%}, all new work at "
            f"{pool['shed_all_at']:.0%}); {pool['source']}; {pool['shed_requests']} requests shed"
        )


@app.command()
def fetch(
    profile: Path = profile_argument(),
    pool: str | None = typer.Option(None, "--pool", help="Pool size override for the re-plan."),
) -> None:
    """Download the profile's hub models into their folders. Each config.json is read first and the plan
    re-made from it; a plan that no longer fits exits 2 with the advice, before any weight is fetched."""
    from stackctl.fetch import fetch_profile

    raise typer.Exit(fetch_profile(profile, parse_size(pool) if pool else None, Console(stderr=True)))


@app.command()
def stress(
    profile: Path | None = profile_option(),
    base_url: str | None = typer.Option(
        None, "--base-url", help="Gateway base URL; default: the profile's gateway.host and gateway.port."
    ),
    layers: str = typer.Option("1-7", "--layers", help="Layers to run, e.g. 1-7, 1,3,5 or 2-4,7."),
    quick: bool = typer.Option(
        False,
        "--quick",
        help="Minutes, not half an hour: fewer requests, 1 minute of concurrency (the profile's quick_* sizes).",
    ),
    out: Path = typer.Option(Path("var/stress"), "--out", help="Folder for stress.md and stress.json."),
    admin_key: str | None = typer.Option(None, envvar="POOLSERVE_ADMIN_KEY", help="The gateway's admin key."),
    admin_key_file: Path | None = typer.Option(None, "--admin-key-file", help="A file holding the admin key."),
    serve_config: Path | None = typer.Option(
        None,
        "--serve-config",
        help="The serve.yaml the stack on this "
        "machine was started with: layers 5 and 7 kill its processes "
        "and restart it. Without it they do not run.",
    ),
    pool: str | None = typer.Option(
        None, "--pool", help="The --pool the stack was started with (its restart uses it again)."
    ),
    note: list[str] = typer.Option([], "--note", help="A line for the report (repeatable)."),
) -> None:
    """The seven-layer acceptance test against a running stack, over HTTP with tenants it creates and
    deletes: a Markdown and JSON report with each layer's figures, thresholds and verdict. Exits 1 when a
    layer fails."""
    from stress.measure import parse_layers
    from stress.report import write_report
    from stress.runner import StressOptions, run_stress

    try:
        chosen = parse_layers(layers)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--layers") from exc
    if admin_key_file is not None:
        admin_key = admin_key_file.read_text().strip()
    if not admin_key:
        raise typer.BadParameter("set POOLSERVE_ADMIN_KEY or pass --admin-key-file", param_hint="--admin-key")
    profile_path = profile_from_serve_config(serve_config, profile) if serve_config else (profile or DEFAULT_PROFILE)
    try:
        prof = load_profile(profile_path)
    except (ValueError, FileNotFoundError) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from exc
    if base_url is None:
        host = "127.0.0.1" if prof.gateway.host in ("0.0.0.0", "::") else prof.gateway.host
        base_url = f"http://{host}:{prof.gateway.port}"
    options = StressOptions(
        base_url=base_url.rstrip("/"),
        admin_key=admin_key,
        profile=prof,
        profile_label=f"{prof.name} ({profile_path})",
        layers=chosen,
        quick=quick,
        serve_config=serve_config,
        profile_path=profile_path,
        pool=pool,
        notes=tuple(note),
    )
    try:
        report = run_stress(options, log=lambda m: typer.echo(m, err=True), on_layer=lambda r: write_report(r, out))
    except RuntimeError as exc:
        typer.echo(f"stress: {exc}", err=True)
        raise typer.Exit(2) from exc
    json_path, md_path = write_report(report, out)
    table = Table(title=f"poolserve stress ({'quick' if quick else 'full'}): {md_path}")
    for col in ("layer", "verdict", "seconds"):
        table.add_column(col)
    for r in report.layers:
        table.add_row(f"{r.layer}. {r.name}", r.verdict, f"{r.seconds:.0f}")
    Console().print(table)
    raise typer.Exit(0 if report.passed else 1)


register_client_commands(app)  # ingest, query, collections, tenants (cli/commands.py)

if __name__ == "__main__":
    app()
