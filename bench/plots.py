"""PNG plots of benchmark results (matplotlib, no display needed). Each plot names the result file, date
and commit it was drawn from, so a plot of a smoke run cannot pass for a full one."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server
import matplotlib.pyplot as plt  # noqa: E402

from bench.harness.results import BenchResult  # noqa: E402

SERVERS = (
    ("raw vllm", "raw vLLM", "tab:gray"),
    ("poolserve", "poolserve", "tab:blue"),
    ("llama.cpp", "llama.cpp", "tab:orange"),
)
SPEC_METHODS = (("none", "tab:gray"), ("ngram", "tab:green"), ("draft_model", "tab:red"))


def _source(result: BenchResult, source: Path) -> str:
    if result.config.get("legacy"):
        return f"{source} (predates the result format: no date or commit recorded)"
    commit = result.commit.removesuffix("-dirty")[:10] + ("-dirty" if result.commit.endswith("-dirty") else "")
    return f"{source} ({result.date}, {commit})"


def serving_plot(result: BenchResult, source: Path, out: Path) -> Path:
    """Output tokens/s and median TTFT per concurrency level, the stack beside raw vLLM; one row of plots
    per prompt set (random tokens, RAG)."""
    datasets = sorted({r.get("dataset", "random") for r in result.rows}, key=lambda d: d != "random")
    by = {(r["server"], r.get("dataset", "random"), r["concurrency"]): r for r in result.rows}
    fig, axes = plt.subplots(len(datasets), 2, figsize=(10, 4 * len(datasets)), squeeze=False)
    for (tok_ax, ttft_ax), dataset in zip(axes, datasets):
        levels = sorted({c for (_, d, c) in by if d == dataset})
        servers = [s for s in SERVERS if all((s[0], dataset, c) in by for c in levels)]
        width = 0.8 / len(servers)
        for i, (key, label, color) in enumerate(servers):
            xs = [x + (i - (len(servers) - 1) / 2) * width for x in range(len(levels))]
            tok_ax.bar(
                xs, [by[(key, dataset, c)]["output_throughput"] for c in levels], width, label=label, color=color
            )
            ttft_ax.bar(xs, [by[(key, dataset, c)]["median_ttft_ms"] for c in levels], width, label=label, color=color)
        tok_ax.set(ylabel="output tokens/s", title=f"Throughput, {dataset} prompts")
        ttft_ax.set(ylabel="median time to first token (ms)", title=f"TTFT p50, {dataset} prompts")
        for ax in (tok_ax, ttft_ax):
            ax.set_xticks(range(len(levels)), [str(c) for c in levels])
            ax.set_xlabel("concurrent streams")
            ax.set_ylim(0, ax.get_ylim()[1] * 1.25)  # room for the legend above the bars
            ax.grid(axis="y", alpha=0.3)
            ax.legend(loc="upper left", ncols=2)
    load = result.config["loads"][0]
    fig.suptitle(
        f"poolserve vs raw vLLM: {load['num_prompts']}+ prompts/level, random {load['input_len']} in / "
        f"{load['output_len']} out tokens\n{_source(result, source)}",
        fontsize=9,
    )
    return _save(fig, out)


def speculative_plot(results: list[tuple[BenchResult, Path, str]], out: Path) -> Path:
    """Tokens/s per workload and concurrency for each speculative method (default preload), one panel per
    engine mode."""
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, (result, source, title) in zip(axes[0], results):
        runs = [run for run in result.rows if run.get("preload", "default") == "default"]
        phases = [(x["workload"], x["concurrency"]) for x in runs[0]["results"]]
        width = 0.8 / len(runs)
        for i, run in enumerate(runs):
            by = {(x["workload"], x["concurrency"]): x for x in run["results"]}
            color = dict(SPEC_METHODS).get(run["method"], None)
            ax.bar(
                [p + i * width for p in range(len(phases))],
                [by[ph]["tokens"] / by[ph]["wall_s"] for ph in phases],
                width,
                label=run["method"],
                color=color,
            )
        ax.set_xticks([p + width * (len(runs) - 1) / 2 for p in range(len(phases))], [f"{w} c={c}" for w, c in phases])
        ax.set(ylabel="generated tokens/s", title=f"{title}\n{_source(result, source)}")
        ax.title.set_fontsize(9)
        ax.grid(axis="y", alpha=0.3)
        ax.legend()
    return _save(fig, out)


def retrieval_plot(result: BenchResult, source: Path, out: Path) -> Path:
    """Query p50 of numpy, the bare FAISS index and the store, per index setting, at the largest N."""
    n = max(r["n"] for r in result.rows)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, queries in zip(axes, ("near", "random")):
        rows = [r for r in result.rows if r["n"] == n and r["queries"] == queries]
        settings = [r["kind"] for r in rows if r["path"] == "store"]
        width = 0.25
        for i, path in enumerate(("numpy", "faiss", "store")):
            values = [r["p50"] for r in rows if r["path"] == path]
            ax.bar([p + i * width for p in range(len(settings))], values, width, label=path)
        ax.set_xticks([p + width for p in range(len(settings))], settings)
        ax.set(title=f"{queries} queries, N={n}", ylabel="query p50 (ms)")
        ax.grid(axis="y", alpha=0.3)
        ax.legend()
    fig.suptitle(f"Retrieval, top_k 4, one query at a time\n{_source(result, source)}", fontsize=9)
    return _save(fig, out)


def retrieval_scale_plot(result: BenchResult, source: Path, out: Path, goal_ms: float = 25.0) -> Path:
    """Left: embed+search and search-alone p50 per number of chunks, for each index as the store builds it,
    against the goal. Right: recall@10 against search p50 for every HNSW efSearch measured, per size."""
    rows = [r for r in result.rows if r["n"]]
    sizes = sorted({r["n"] for r in rows})
    fig, (lat_ax, rec_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for kind, color in (("flat", "tab:gray"), ("hnsw", "tab:blue")):
        mine = {r["n"]: r for r in rows if r["kind"] == kind and r["store_default"]}
        if not mine:
            continue
        label = next(iter(mine.values()))["setting"]
        lat_ax.plot(
            sizes, [mine[n]["embed_search_p50"] for n in sizes], "o-", color=color, label=f"{label}: embed + search"
        )
        lat_ax.plot(sizes, [mine[n]["p50"] for n in sizes], "o--", color=color, label=f"{label}: search alone")
    lat_ax.axhline(goal_ms, color="tab:red", lw=1, ls=":", label=f"goal {goal_ms:g} ms (at 100k)")
    lat_ax.set(
        xscale="log",
        yscale="log",
        xlabel="chunks in the index",
        ylabel="p50 per question (ms)",
        title="One question at a time, top 10",
    )
    lat_ax.legend(fontsize=7)
    lat_ax.grid(alpha=0.3, which="both")
    for n, marker in zip(sizes, "os^vD"):
        hnsw = sorted((r for r in rows if r["n"] == n and r["kind"] == "hnsw"), key=lambda r: r["p50"])
        rec_ax.plot([r["p50"] for r in hnsw], [r["recall"] for r in hnsw], marker + "-", label=f"HNSW, {n:,} chunks")
        for r in hnsw:
            rec_ax.annotate(
                r["setting"].split()[-1],
                (r["p50"], r["recall"]),
                fontsize=6,
                xytext=(3, -8),
                textcoords="offset points",
            )
        flat = [r for r in rows if r["n"] == n and r["kind"] == "flat"]
        rec_ax.plot([r["p50"] for r in flat], [r["recall"] for r in flat], marker, color="tab:gray")
    rec_ax.set(
        xscale="log",
        xlabel="search p50 (ms), grey: flat (exact)",
        ylabel="recall@10 vs exact",
        title="Recall against search time (HNSW efSearch)",
    )
    rec_ax.legend(fontsize=7)
    rec_ax.grid(alpha=0.3, which="both")
    fig.suptitle(
        f"Retrieval on MiniLM embeddings of the pydoc corpus ({result.config['real_chunks']:,} real, the rest "
        f"perturbed)\n{_source(result, source)}",
        fontsize=9,
    )
    return _save(fig, out)


def _save(fig, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
