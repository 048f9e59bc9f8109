"""`poolserve fetch PROFILE`: download a profile's models from a hub, but only while the plan still fits.

For every model with a `hub:` source, before any weight byte is fetched:
  1. the repo's listing (file sizes, the commit the revision names) and its config.json are read;
  2. every field the planner reads is compared with the bundled configs/models/<name>.json;
  3. the whole profile is re-planned from those configs and the listed checkpoint sizes. A plan that
     no longer fits is refused with the planner's advice and nothing is downloaded.
Then each repo is downloaded into the profile's `model` folder at that same commit, so the weights
match the config that was checked. Models with only a local folder are checked, not fetched.
Network code lives here: planner/ stays pure.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx2
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import XetDownloadError
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn
from rich.table import Table
from tqdm.std import tqdm

from planner.architecture import Architecture, architecture_from_config, bundled_facts, find_config
from planner.plan import Plan, build_plan
from planner.profile import HubSource, Profile, load_profile
from planner.units import gib

# What a served folder needs: configs, tokenizer, chat template and safetensors weights; not the
# .bin / .pt / ONNX copies many repos also carry.
ALLOW_PATTERNS = ("*.json", "*.safetensors", "tokenizer*", "*.model", "vocab.txt", "merges.txt", "*.jinja")
HUB_TIMEOUT_S = 30.0  # listing and per-file HEAD calls; each download read is bounded by HF_HUB_DOWNLOAD_TIMEOUT
DOWNLOAD_WORKERS = 4
HUB_ERRORS = (httpx2.HTTPError, OSError, ValueError, XetDownloadError)
NOT_FROM_CONFIG = ("name", "source")  # Architecture fields that name the file, not what it says

EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2


@dataclass(frozen=True)
class ModelRef:
    """One model folder a profile names; `section` says where (chat, chat.speculative, embedder, ...)."""

    section: str
    folder: Path
    hub: HubSource | None
    architecture: str | None = None


@dataclass(frozen=True)
class HubModel:
    """What the hub says about one model before any weight is fetched."""

    ref: ModelRef
    commit: str
    config: dict
    weights: dict[str, int]  # top-level *.safetensors -> bytes, as the listing gives them
    staged: Path  # a folder the planner reads as if the checkpoint were here


def profile_models(profile: Profile) -> list[ModelRef]:
    """Every model folder in the profile, in start order."""
    refs = []
    for name, chat in profile.chat_engines():
        refs.append(ModelRef(name, Path(chat.model), chat.hub, chat.architecture))
        spec = chat.speculative
        if spec.model:
            refs.append(ModelRef(f"{name}.speculative", Path(spec.model), spec.hub, spec.architecture))
    refs.append(ModelRef("embedder", Path(profile.embedder.model), profile.embedder.hub))
    return refs


def local_problem(ref: ModelRef) -> str | None:
    """None when a local-only folder is ready to load; else what is wrong with it."""
    if not ref.folder.is_dir():
        return "does not exist"
    if not (ref.folder / "config.json").is_file():
        return "has no config.json"
    return None


def probe(ref: ModelRef, endpoint: str | None, staging: Path) -> HubModel:
    """The repo's listing and config.json at the pinned revision; no weight byte is read."""
    hub = ref.hub
    assert hub is not None
    info = HfApi(endpoint=endpoint).model_info(
        hub.repo_id, revision=hub.revision, files_metadata=True, timeout=HUB_TIMEOUT_S
    )
    if not info.sha:
        raise ValueError(f"the hub named no commit for {hub.repo_id}@{hub.revision}")
    # A branch moves: everything below reads the commit it named now, so config and weights match.
    staged = staging / ref.section / ref.folder.name
    path = hf_hub_download(
        hub.repo_id, "config.json", revision=info.sha, local_dir=staged, endpoint=endpoint, etag_timeout=HUB_TIMEOUT_S
    )
    weights = {
        s.rfilename: (s.lfs.size if s.lfs else s.size) or 0
        for s in info.siblings or []
        if s.rfilename.endswith(".safetensors") and "/" not in s.rfilename
    }
    # The planner sizes a checkpoint by stat()-ing its safetensors: sparse files of the listed sizes let
    # it plan this exact checkpoint without a byte of it on disk.
    for name, size in weights.items():
        with open(staged / name, "wb") as placeholder:
            placeholder.truncate(size)
    return HubModel(ref, info.sha, json.loads(Path(path).read_text()), weights, staged)


def differences(model: HubModel) -> tuple[Path | None, list[str]]:
    """(bundled facts file, one line per field the planner reads that the hub's config sets otherwise)."""
    bundled = bundled_facts(str(model.ref.folder), model.ref.architecture)
    if bundled is None:
        return None, []
    ours = architecture_from_config(json.loads(bundled.read_text()))
    # read as the planner will read the fetched folder (the bundled poolserve facts kept beside it)
    cfg, _ = find_config(str(model.staged), model.ref.architecture)
    theirs = architecture_from_config(cfg)
    lines = []
    for f in dataclasses.fields(Architecture):
        before, after = getattr(ours, f.name), getattr(theirs, f.name)
        if f.name not in NOT_FROM_CONFIG and before != after:
            lines.append(f"{f.name}: bundled {before!r}, hub {after!r}")
    return bundled, lines


def staged_profile(profile: Profile, staged: dict[str, Path]) -> Profile:
    """The profile with each hub model's folder replaced by its staged folder (section -> folder)."""

    def engine(name, chat):
        spec = chat.speculative
        if f"{name}.speculative" in staged:
            spec = spec.model_copy(update={"model": str(staged[f"{name}.speculative"])})
        update = {"speculative": spec}
        if name in staged:
            update["model"] = str(staged[name])
        return chat.model_copy(update=update)

    engines = [engine(name, chat) for name, chat in profile.chat_engines()]
    update: dict = {"chat": engines[0], "engines": engines[1:]}
    if "embedder" in staged:
        update["embedder"] = profile.embedder.model_copy(update={"model": str(staged["embedder"])})
    return profile.model_copy(update=update)


def plan_table(plan: Plan) -> Table:
    """The re-planned per-replica numbers."""
    table = Table(title=f"re-planned from the hub's configs: {plan.profile} on pool {plan.pool.name}")
    for column in ("replica", "planned", "at rest", "engine"):
        table.add_column(column, justify="left" if column in ("replica", "engine") else "right")
    for r in sorted(plan.replicas, key=lambda r: r.start_order):
        facts = plan.engines.get(r.name)
        engine = ""
        if facts:
            engine = (
                f"weights {gib(facts.weight_bytes)}, KV {facts.kv_pool_tokens:,} tokens, "
                f"max_num_seqs {facts.max_num_seqs}"
            )
            if r.vllm and r.vllm.gpu_memory_utilization:
                engine += f", gpu_memory_utilization {r.vllm.gpu_memory_utilization}"
        copies = f" x{r.num_replicas}" if r.num_replicas > 1 else ""
        table.add_row(
            f"{r.name}{copies}", gib(r.pool_bytes), gib(r.pool_bytes - r.growth_bytes * r.num_replicas), engine
        )
    return table


def _bar_class(progress: Progress, label: str) -> type[tqdm]:
    """A tqdm class, which is what huggingface_hub drives, that draws into a rich Progress."""

    class RichBar(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.pop("name", None)  # huggingface_hub's own tqdm takes a name; tqdm does not
            kwargs["file"] = io.StringIO()  # tqdm's text line goes nowhere: rich draws the bar
            self._task = None
            super().__init__(*args, **kwargs)

        def display(self, msg=None, pos=None):
            total = self.total or None
            if self.unit == "B":
                amount = gib(self.n) + (f" / {gib(total)}" if total else "")
            else:
                amount = f"{self.n}/{total or '?'} files"
            fields = {
                "description": f"{label}: {self.desc.rstrip(': ')}",
                "completed": self.n,
                "total": total,
                "amount": amount,
            }
            if self._task is None:
                self._task = progress.add_task(**fields)
            else:
                progress.update(self._task, **fields)
            return True

    return RichBar


def download(model: HubModel, endpoint: str | None, console: Console) -> None:
    """The repo's served files into the profile's folder, at the commit whose config was checked."""
    hub, folder = model.ref.hub, model.ref.folder
    assert hub is not None
    folder.mkdir(parents=True, exist_ok=True)
    columns = (TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(), TextColumn("{task.fields[amount]}"))
    with Progress(*columns, console=console) as progress:
        snapshot_download(
            hub.repo_id,
            revision=model.commit,
            local_dir=folder,
            allow_patterns=list(ALLOW_PATTERNS),
            endpoint=endpoint,
            etag_timeout=HUB_TIMEOUT_S,
            max_workers=DOWNLOAD_WORKERS,
            tqdm_class=_bar_class(progress, model.ref.section),
        )
    fetched = folder / "config.json"
    if not fetched.is_file() or json.loads(fetched.read_text()) != model.config:
        raise ValueError(f"{fetched} is not the config.json that was checked at {model.commit}")


def _say(console: Console, text: str) -> None:
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def _local_missing(refs: list[ModelRef], console: Console) -> list[str]:
    """Check the folders that have no hub source; one line per folder that is not ready."""
    missing = []
    for ref in refs:
        if ref.hub is None:
            problem = local_problem(ref)
            missing += [f"{ref.section}: {ref.folder} {problem}"] if problem else []
            _say(console, f"{ref.section}: local folder {ref.folder}: {problem or 'ok'}; no hub source, skipped")
    return missing


def _report(model: HubModel, console: Console) -> None:
    section, hub = model.ref.section, model.ref.hub
    size = f"{gib(sum(model.weights.values()))} in {len(model.weights)} safetensors files"
    _say(console, f"{section}: {hub.repo_id}@{hub.revision} is commit {model.commit}; config.json read, {size} listed")
    bundled, lines = differences(model)
    if bundled is None:
        _say(console, f"{section}: no bundled configs/models facts to compare with")
    elif lines:
        _say(console, f"{section}: config.json differs from {bundled.name} in {len(lines)} field(s) the planner reads:")
        for line in lines:
            _say(console, f"  {line}")
    else:
        _say(console, f"{section}: config.json matches {bundled.name} in every field the planner reads")


def _replan(profile: Profile, models: list[HubModel], pool_bytes: int | None, console: Console) -> bool:
    """Plan the profile from the hub's configs; print its numbers, or the refusal and the advice."""
    try:
        plan = build_plan(staged_profile(profile, {m.ref.section: m.staged for m in models}), pool_bytes)
    except (ValueError, FileNotFoundError) as exc:
        _say(console, "refused: the plan fails with the hub's configs; nothing was downloaded.")
        _say(console, str(exc))
        return False
    console.print(plan_table(plan))
    p = plan.pool
    start = f", {gib(p.start_headroom_bytes)} while starting" if plan.start_peak else ""
    _say(
        console,
        f"fits: {gib(p.free_bytes - p.headroom_bytes)} of {gib(p.free_bytes)} free planned; "
        f"headroom {gib(p.headroom_bytes)}{start}",
    )
    return True


def fetch_profile(
    profile_path: Path, pool_bytes: int | None = None, console: Console | None = None, endpoint: str | None = None
) -> int:
    """The command: returns the exit code (0 every model ready, 1 a folder is missing or the hub fails,
    2 the profile or its re-plan is refused)."""
    console = console or Console(stderr=True)
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None  # read now: huggingface_hub reads it at import
    try:
        profile = load_profile(profile_path)
    except (ValueError, FileNotFoundError) as exc:
        _say(console, str(exc))
        return EXIT_REFUSED
    refs = profile_models(profile)
    missing = _local_missing(refs, console)
    if missing:
        # the plan needs every folder (the embedder's weights, a chat model's config): fetch all or nothing
        _say(
            console,
            "not ready, nothing fetched: " + "; ".join(missing) + ". Provide the folder (make models) "
            "or give it a hub: source.",
        )
        return EXIT_FAILED
    hub_refs = [ref for ref in refs if ref.hub is not None]
    if not hub_refs:
        _say(console, "no model has a hub source: nothing to fetch")
        return EXIT_OK
    models = []
    with tempfile.TemporaryDirectory(prefix="poolserve-fetch-") as tmp:
        for ref in hub_refs:
            try:
                models.append(probe(ref, endpoint, Path(tmp)))
            except HUB_ERRORS as exc:
                _say(
                    console,
                    f"{ref.section}: cannot read config.json of {ref.hub.repo_id}@{ref.hub.revision}: "
                    f"{exc.__class__.__name__}: {exc}",
                )
                return EXIT_FAILED
            _report(models[-1], console)
        if not _replan(profile, models, pool_bytes, console):
            return EXIT_REFUSED
    for model in models:
        ref = model.ref
        _say(console, f"{ref.section}: downloading {ref.hub.repo_id}@{model.commit} into {ref.folder}")
        try:
            download(model, endpoint, console)
        except HUB_ERRORS as exc:
            _say(console, f"{ref.section}: download failed: {exc.__class__.__name__}: {exc}")
            return EXIT_FAILED
        _say(console, f"{ref.section}: {ref.folder} ready")
    return EXIT_OK
