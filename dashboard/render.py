"""The dashboard's HTML, rendered on the server from one snapshot (gateway/routes/dashboard_api.py builds it).

The page's script swaps these sections in on every refresh, so there is one renderer. Every number is
also in a data-* attribute, exact (bytes, counts), so a test or a scraper reads what the page shows
without parsing formatted text. Every value from the stack is escaped.
"""

from __future__ import annotations

from html import escape

MIB = 2**20
# Replica colours on the pool bar and in the chart (static/dashboard.js keeps the same order).
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7")


def mib(value) -> str:
    """A size as people read it: GiB from 1 GiB up, else MiB (exact bytes are in the data-* attributes)."""
    if value is None:
        return "n/a"
    return f"{value / 2**30:,.2f} GiB" if abs(value) >= 2**30 else f"{value / MIB:,.1f} MiB"


def _attr(value) -> str:
    return escape("" if value is None else str(value), quote=True)


def _limit(value) -> str:
    return "unlimited" if value is None else f"{value:,}"


def render_pool(status: dict) -> str:
    pool, replicas = status["pool"], status["replicas"]
    limit = pool["limit_bytes"] or 1
    segments, accounted = [], 0
    for i, replica in enumerate(replicas):
        measured = replica.get("measured_bytes") or 0
        accounted += measured
        segments.append(
            f'<div class="seg" title="{_attr(replica["name"])}: {mib(measured)}" '
            f'style="width:{100 * measured / limit:.3f}%;background:{PALETTE[i % len(PALETTE)]}"></div>'
        )
    other = max(0, pool["used_bytes"] - accounted)  # in the pool but not a replica: Ray, the OS, other processes
    segments.append(
        f'<div class="seg other" title="other: {mib(other)}" style="width:{100 * other / limit:.3f}%"></div>'
    )
    planned = sum(r.get("planned_bytes") or 0 for r in replicas)
    legend = "".join(
        f'<span class="key"><i style="background:{PALETTE[i % len(PALETTE)]}"></i>{escape(r["name"])}</span>'
        for i, r in enumerate(replicas)
    )
    return f"""
<section id="pool" data-pool-used-bytes="{pool["used_bytes"]}" data-pool-limit-bytes="{pool["limit_bytes"]}"
  data-guard-state="{_attr(pool["state"])}" data-shed-ingest-at="{pool["shed_ingest_at"]}"
  data-shed-all-at="{pool["shed_all_at"]}" data-planned-bytes="{planned}">
 <h2>Pool <span class="state state-{_attr(pool["state"])}">{escape(pool["state"])}</span></h2>
 <p>{mib(pool["used_bytes"])} of {mib(pool["limit_bytes"])} in use ({pool["fraction"]:.1%}), {escape(pool["source"])};
  replicas planned {mib(planned)}. Sheds ingestion at {pool["shed_ingest_at"]:.0%}, all new work at
  {pool["shed_all_at"]:.0%}; {pool["shed_requests"]} requests shed.</p>
 <div class="bar">{"".join(segments)}
  <div class="band ingest" style="left:{100 * pool["shed_ingest_at"]:.2f}%;width:{100 * (pool["shed_all_at"] - pool["shed_ingest_at"]):.2f}%"
   title="sheds ingestion"></div>
  <div class="band all" style="left:{100 * pool["shed_all_at"]:.2f}%;width:{100 * (1 - pool["shed_all_at"]):.2f}%"
   title="sheds all new work"></div>
  <div class="mark" style="left:{min(100.0, 100 * planned / limit):.2f}%" title="planned: {mib(planned)}"></div>
 </div>
 <div class="legend">{legend}<span class="key"><i class="other"></i>other</span>
  <span class="key"><i class="markkey"></i>planned total</span><span class="key"><i class="band-key ingest"></i>sheds
  ingestion</span><span class="key"><i class="band-key all"></i>sheds all new work</span></div>
</section>"""


def _at_rest(replica: dict):
    """The plan at rest; for the retriever, for what it holds now (its index and cache as they are filled)."""
    return replica.get("planned_for_contents_bytes") or replica.get("planned_at_rest_bytes")


def render_replicas(status: dict) -> str:
    rows = []
    for r in status["replicas"]:
        planned, measured = r.get("planned_bytes"), r.get("measured_bytes")
        share = f"{measured / planned:.0%}" if planned and measured is not None else "n/a"
        state = r.get("engine_state", "")  # an on-demand engine's: awake, asleep, waking or sleeping
        rows.append(
            f'<tr data-replica="{_attr(r["name"])}" data-planned-bytes="{_attr(planned)}" '
            f'data-measured-bytes="{_attr(measured)}" data-engine-state="{_attr(state)}">'
            f"<td>{escape(r['name'])}</td><td>{escape(state)}</td><td>{mib(planned)}</td>"
            f"<td>{mib(_at_rest(r))}</td><td>{mib(measured)}</td><td>{share}</td>"
            f"<td>{escape(r.get('error', ''))}</td></tr>"
        )
    return (
        '<section id="replicas"><h2>Replicas: planned against measured (PSS)</h2><table><thead><tr>'
        "<th>replica</th><th>on demand</th><th>planned</th><th>planned at rest</th><th>measured</th><th>of plan</th>"
        "<th></th>"
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table></section>"
    )


def render_tenants(tenants: list[dict], day: str) -> str:
    rows = []
    for t in tenants:
        today = t["today"]
        rows.append(
            f'<tr data-tenant="{_attr(t["name"])}" data-requests="{today["requests"]}" data-tokens="{today["tokens"]}" '
            f'data-rejected="{today["rejected"]}" data-rpm="{_attr(t["rpm"])}" data-tpm="{_attr(t["tpm"])}" '
            f'data-max-concurrency="{_attr(t["max_concurrency"])}"><td>{escape(t["name"])}</td>'
            f"<td>{today['requests']:,}</td><td>{today['tokens']:,}</td><td>{today['rejected']:,}</td>"
            f"<td>{_limit(t['rpm'])}</td><td>{_limit(t['tpm'])}</td><td>{_limit(t['max_concurrency'])}</td>"
            f"<td>{escape(', '.join(t['models'])) if t['models'] is not None else 'all'}</td></tr>"
        )
    return (
        f'<section id="tenants" data-day="{_attr(day)}"><h2>Tenants today ({escape(day)} UTC)</h2><table><thead><tr>'
        "<th>tenant</th><th>requests</th><th>tokens</th><th>429s</th><th>rpm</th><th>tpm</th>"
        f"<th>concurrency</th><th>models</th></tr></thead><tbody>{''.join(rows)}</tbody></table></section>"
    )


def render_collections(collections: dict) -> str:
    rows = [
        f'<tr data-collection="{_attr(c["tenant"])}/{_attr(c["name"])}" data-documents="{c["documents"]}" '
        f'data-chunks="{c["chunks"]}"><td>{escape(c["tenant"])}</td><td>{escape(c["name"])}</td>'
        f"<td>{c['documents']:,}</td><td>{c['chunks']:,}</td><td>{escape(collections['index'])}</td></tr>"
        for c in collections["data"]
    ]
    empty = '<tr><td colspan="5">no collections yet</td></tr>' if not rows else ""
    return (
        f'<section id="collections" data-index="{_attr(collections["index"])}"><h2>Collections</h2><table><thead>'
        "<tr><th>tenant</th><th>collection</th><th>documents</th><th>chunks</th><th>index</th></tr></thead>"
        f"<tbody>{''.join(rows) or empty}</tbody></table></section>"
    )


def render_sections(snapshot: dict) -> str:
    return (
        f'<div id="snapshot" data-taken-at="{_attr(snapshot["taken_at"])}">'
        + render_pool(snapshot["status"])
        + render_replicas(snapshot["status"])
        + '<section id="history"><h2>Measured memory, last hour (MiB)</h2><div id="memory-chart"></div></section>'
        + render_tenants(snapshot["tenants"], snapshot["day"])
        + render_collections(snapshot["collections"])
        + "</div>"
    )


def _document(title: str, body: str) -> str:
    # Relative links: the page works under any route prefix.
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="dashboard/static/uPlot.min.css"><link rel="stylesheet" href="dashboard/static/dashboard.css">
</head><body>{body}</body></html>"""


def page(snapshot: dict, refresh_s: float) -> str:
    body = (
        f'<header><h1>poolserve</h1><span id="updated" data-refresh-s="{refresh_s}">updated '
        f'{escape(snapshot["taken_at"])}</span><form method="post" action="dashboard/logout">'
        f'<button>sign out</button></form></header><main id="sections">{render_sections(snapshot)}</main>'
        '<script src="dashboard/static/uPlot.iife.min.js"></script><script src="dashboard/static/dashboard.js"></script>'
    )
    return _document("poolserve dashboard", body)


def login_page(problem: str | None = None) -> str:
    # Served at /dashboard/login: the form posts back to it ("login" is relative to that URL).
    note = f'<p class="problem">{escape(problem)}</p>' if problem else ""
    body = (
        f'<main class="login"><h1>poolserve dashboard</h1>{note}<form method="post" action="login">'
        '<label>Admin key <input type="password" name="key" id="key" autocomplete="current-password" required>'
        '</label><button id="sign-in">sign in</button></form></main>'
    )
    return _document("poolserve dashboard: sign in", body).replace('href="dashboard/static/', 'href="static/')
