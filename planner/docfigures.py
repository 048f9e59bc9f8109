"""The plan figures docs/PLANNER.md quotes, generated from the planner so they cannot drift.

The doc marks each generated block with `<!-- figures: PROFILE -->` ... `<!-- /figures -->`;
`python -m planner.docfigures docs/PLANNER.md` rewrites them and tests/unit/planner/test_planner_docs.py
checks the doc matches. CPU profiles are planned for this machine's 24 GiB.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from planner.plan import build_plan
from planner.profile import load_profile
from planner.units import GiB, gib

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- figures: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.S)


def render(name: str) -> str:
    # CPU profiles (`dtype: auto`) as on a host with native bfloat16, whichever machine regenerates the doc.
    plan = build_plan(
        load_profile(ROOT / "configs" / f"{name}.yaml"),
        24 * GiB if name.startswith("cpu") else None,
        cpu_native_bf16=True,
    )
    p = plan.pool
    out = ["| line | bytes | |", "|---|---:|---:|"]
    for r in plan.replicas:
        if r.kind == "chat":
            out += [f"| {r.name}.{k} | {v:,} | {gib(v)} |" for k, v in r.breakdown.items()]
        copies = f" (x{r.num_replicas})" if r.num_replicas > 1 else ""
        out.append(f"| **{r.name}**{copies} | **{r.pool_bytes:,}** | {gib(r.pool_bytes)} |")
    out += [f"| ray (system + object store) | {p.ray_bytes:,} | {gib(p.ray_bytes)} |"]
    out += [f"| {k} | {v:,} | {gib(v)} |" for k, v in plan.page_cache.items()]
    out += [
        "",
        f"Pool {p.total_bytes:,} - reserve {p.reserve_bytes:,} = {p.free_bytes:,} free; planned "
        f"{p.free_bytes - p.headroom_bytes:,}; headroom **{gib(p.headroom_bytes)}** at steady state",
    ]
    if plan.start_peak:
        out[-1] += (
            f", **{gib(p.start_headroom_bytes)}** while starting (tightest engine's start peak "
            f"{gib(p.start_peak_bytes)}: {', '.join(plan.start_peak)})"
        )
    out[-1] += "."
    for name_, c in plan.engines.items():
        r = plan.replica(name_)
        line = (
            f"{name_}: {c.kv_bytes_per_token:,} B/token, block {c.block_size}, {c.num_blocks:,} blocks = "
            f"{c.kv_pool_tokens:,} tokens as vLLM counts them, max_num_seqs {c.max_num_seqs}"
        )
        if c.state_bytes_per_sequence:
            line += (
                f"; state {c.state_bytes_per_sequence:,} B/sequence ({c.state_pool_bytes_per_sequence:,} "
                f"as a padded block); groups of {c.kv_group_size}: {', '.join(c.kv_group_layers)}"
            )
        util = r.vllm.gpu_memory_utilization
        line += f"; gpu_memory_utilization {util}." if util else "."
        out.append(line)
    for a in plan.admission:
        if a.overhead_bytes or a.start_peak_bytes:
            out.append(
                f"Admission {a.name}: {gib(a.requested_bytes)} requested, {gib(a.free_before_bytes)} free at "
                f"its turn, {gib(a.free_before_bytes - a.overhead_bytes)} when vLLM samples it."
            )
    return "\n".join(out) + "\n"


def regenerate(doc: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + render(m.group("name")) + m.group(4), doc)


if __name__ == "__main__":
    path = Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "docs" / "PLANNER.md")
    path.write_text(regenerate(path.read_text()))
