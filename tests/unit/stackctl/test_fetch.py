"""`poolserve fetch` against a fake Hugging Face hub: a local HTTP server speaking the few endpoints
huggingface_hub 2.4 calls, so its real download path runs with no network.

  GET  /api/models/{repo}/revision/{rev}   model_info: the commit and the file listing (blobs=True sizes)
  GET  /api/models/{repo}/tree/{rev}       snapshot_download's recursive listing
  HEAD /{repo}/resolve/{rev}/{file}        per-file metadata: X-Repo-Commit, ETag, Content-Length
  GET  /{repo}/resolve/{rev}/{file}        the bytes
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from cli.main import app
from planner.plan import build_plan
from planner.profile import load_profile
from planner.units import gib
from stackctl.fetch import fetch_profile

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[3]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "poolserve-test/Qwen3.8-Flash-Next-NVFP4"
WEIGHTS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")


def hub_config(bundled: str = "qwen3.8-flash-next", **changes) -> bytes:
    """Bundled architecture facts as a hub's config.json would carry them: no poolserve block, no notes."""
    cfg = json.loads((ROOT / f"configs/models/{bundled}.json").read_text())
    cfg = {k: v for k, v in cfg.items() if k not in ("_comment", "_sources", "poolserve")}
    return json.dumps({**cfg, **changes}).encode()


def repo_files(config: bytes) -> dict[str, bytes]:
    files = {
        "config.json": config,
        "tokenizer.json": b'{"version": "1.0"}',
        "chat_template.jinja": b"{{ m }}",
        "README.md": b"# not served by fetch",
        "pytorch_model.bin": b"pickled copy, not fetched",
    }
    files |= {name: bytes([i]) * (70_000 + i) for i, name in enumerate(WEIGHTS)}
    files["model.safetensors.index.json"] = json.dumps({"weight_map": {"w": WEIGHTS[0]}}).encode()
    return files


class _HubHandler(BaseHTTPRequestHandler):
    timeout = 10  # a stalled client cannot hold a server thread

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self._serve(body=False)

    def do_GET(self):
        self._serve(body=True)

    def _reply(self, status: int, data: bytes, headers: dict, body: bool) -> None:
        self.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(data))}.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _serve(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        hub: FakeHub = self.server  # type: ignore[assignment]
        hub.seen.append((self.command, path))
        listing = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(revision|tree)/([^/]+)", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if listing:
            repo, rev = listing.group(1), listing.group(3)
        elif resolve:
            repo, rev = resolve.group(1), resolve.group(2)
        else:
            return self._reply(404, b"", {}, body)
        if repo not in hub.repos:
            return self._reply(404, b"", {"X-Error-Code": "RepoNotFound"}, body)
        if rev not in ("main", COMMIT):
            return self._reply(404, b"", {"X-Error-Code": "RevisionNotFound"}, body)
        files = hub.repos[repo]
        if listing and listing.group(2) == "revision":
            siblings = [
                {"rfilename": name, "size": len(data), "blobId": _sha1(data), **_lfs(name, data, "sha256")}
                for name, data in files.items()
            ]
            return self._reply(
                200,
                json.dumps({"id": repo, "sha": COMMIT, "siblings": siblings}).encode(),
                {"Content-Type": "application/json"},
                body,
            )
        if listing:
            tree = [
                {"type": "file", "path": name, "size": len(data), "oid": _sha1(data), **_lfs(name, data, "oid")}
                for name, data in files.items()
            ]
            return self._reply(200, json.dumps(tree).encode(), {"Content-Type": "application/json"}, body)
        name = resolve.group(3)
        if name not in files:
            return self._reply(404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT}, body)
        data = files[name]
        etag = hashlib.sha256(data).hexdigest() if name.endswith(".safetensors") else _sha1(data)
        self._reply(200, data, {"X-Repo-Commit": COMMIT, "ETag": f'"{etag}"'}, body)


def _sha1(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


def _lfs(name: str, data: bytes, hash_key: str) -> dict:
    if not name.endswith(".safetensors"):
        return {}
    return {"lfs": {"size": len(data), hash_key: hashlib.sha256(data).hexdigest(), "pointerSize": 134}}


class FakeHub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _HubHandler)
        self.repos: dict[str, dict[str, bytes]] = {}
        self.seen: list[tuple[str, str]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def requested(self, suffix: str) -> list[tuple[str, str]]:
        return [(method, path) for method, path in self.seen if path.endswith(suffix)]


@pytest.fixture
def hub(monkeypatch, tmp_path):
    server = FakeHub()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def spark_profile(tmp_path: Path, embedder: str | None = None) -> Path:
    """configs/dgx-spark-128.yaml with its chat model fetched from the fake hub into tmp_path/models."""
    data = yaml.safe_load((ROOT / "configs/dgx-spark-128.yaml").read_text())
    data.pop("tenants_file")
    data["chat"]["model"] = "models/Qwen3.8-Flash-Next-NVFP4"
    data["chat"]["hub"] = {"repo_id": REPO, "revision": "main"}
    data["embedder"]["model"] = embedder or str(ROOT / "models/all-MiniLM-L6-v2")
    path = tmp_path / "spark.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_fetch(profile: Path) -> tuple[int, str]:
    out = StringIO()
    code = fetch_profile(profile, console=Console(file=out, width=200, force_terminal=False))
    return code, out.getvalue()


def test_config_that_fits_is_checked_then_the_weights_are_fetched_with_progress(hub, tmp_path):
    hub.repos[REPO] = files = repo_files(hub_config())
    code, out = run_fetch(spark_profile(tmp_path))
    assert code == 0, out
    assert f"chat: {REPO}@main is commit {COMMIT}" in out
    assert "config.json matches qwen3.8-flash-next.json in every field the planner reads" in out
    assert "re-planned from the hub's configs" in out and "fits:" in out and "gpu_memory_utilization 0." in out
    assert "chat: Fetching 6 files" in out  # the rich progress bar, fed by huggingface_hub
    folder = tmp_path / "models/Qwen3.8-Flash-Next-NVFP4"
    for name in (*WEIGHTS, "config.json", "tokenizer.json", "chat_template.jinja", "model.safetensors.index.json"):
        assert (folder / name).read_bytes() == files[name]
    assert not (folder / "README.md").exists() and not (folder / "pytorch_model.bin").exists()
    # config.json (and only it) came before any weight byte; everything at the commit the branch named
    first_weight = min(i for i, (_, path) in enumerate(hub.seen) if path.endswith(".safetensors"))
    assert ("GET", f"/{REPO}/resolve/{COMMIT}/config.json") in hub.seen[:first_weight]
    assert all(COMMIT in path for _, path in hub.seen if "/resolve/" in path)
    assert "embedder: local folder" in out and "ok; no hub source, skipped" in out


def test_the_fetched_folder_plans_as_the_fetch_re_planned_it(hub, tmp_path):
    """The planner reads the fetched config.json with the bundled facts it cannot carry (the PLE table)."""
    hub.repos[REPO] = repo_files(hub_config())
    profile = spark_profile(tmp_path)
    code, out = run_fetch(profile)
    assert code == 0, out
    plan = build_plan(load_profile(profile))
    assert plan.chat.architecture_source.endswith("qwen3.8-flash-next.json")
    assert "config.json + poolserve facts" in plan.chat.architecture_source
    chat = plan.replica("chat")
    assert "weights.ple (fp8)" not in chat.breakdown  # placement {ple: disk} still finds the table
    assert any(line.startswith("page_cache.chat.ple") for line in plan.page_cache)
    assert gib(chat.pool_bytes) in next(line for line in out.splitlines() if "│ chat " in line)


def test_config_that_differs_is_reported_field_by_field(hub, tmp_path):
    hub.repos[REPO] = repo_files(hub_config(max_position_embeddings=131072, moe_intermediate_size=512))
    code, out = run_fetch(spark_profile(tmp_path))
    assert code == 0, out  # smaller experts: it still fits, so it is fetched
    assert "config.json differs from qwen3.8-flash-next.json in 2 field(s) the planner reads:" in out
    assert "max_position_embeddings: bundled 262144, hub 131072" in out
    assert "moe_intermediate_size: bundled 640, hub 512" in out
    assert (tmp_path / "models/Qwen3.8-Flash-Next-NVFP4" / WEIGHTS[0]).exists()


def test_config_that_no_longer_fits_is_refused_before_any_weight(hub, tmp_path, monkeypatch):
    hub.repos[REPO] = repo_files(hub_config(num_hidden_layers=64, hidden_size=3072))
    monkeypatch.setenv("POOLSERVE_PROFILE", str(spark_profile(tmp_path)))
    result = CliRunner().invoke(app, ["fetch"])
    out = result.output
    assert result.exit_code == 2, out
    assert "num_layers: bundled 48, hub 64" in out and "hidden_size: bundled 2560, hub 3072" in out
    assert "nothing was downloaded" in out
    assert "plan refused: profile dgx-spark-128 needs" in out and "Ways to fit" in out
    assert hub.requested(".safetensors") == []  # not a HEAD, not a byte
    assert not (tmp_path / "models/Qwen3.8-Flash-Next-NVFP4").exists()


def test_unknown_revision_fails_cleanly(hub, tmp_path):
    hub.repos[REPO] = repo_files(hub_config())
    profile = spark_profile(tmp_path)
    profile.write_text(profile.read_text().replace("revision: main", "revision: no-such-branch"))
    code, out = run_fetch(profile)
    assert code == 1 and "cannot read config.json of" in out and "RevisionNotFoundError" in out
    assert hub.requested(".safetensors") == []


def test_local_only_models_are_checked_and_skipped(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("POOLSERVE_PROFILE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing to fetch: never called
    result = CliRunner().invoke(app, ["fetch"])  # configs/cpu-tiny.yaml: local folders only
    assert result.exit_code == 0, result.output
    assert "nothing to fetch" in result.output
    assert result.output.count("ok; no hub source, skipped") == 2


def test_a_missing_local_folder_is_named_and_nothing_is_fetched(hub, tmp_path):
    hub.repos[REPO] = repo_files(hub_config())
    code, out = run_fetch(spark_profile(tmp_path, embedder=str(tmp_path / "absent-embedder")))
    assert code == 1 and f"embedder: local folder {tmp_path / 'absent-embedder'}: does not exist" in out
    assert "not ready, nothing fetched" in out and hub.seen == []


def test_a_draft_model_is_fetched_beside_its_target(hub, tmp_path):
    """configs/dgx-spark-27b.yaml: the target and its DSpark drafter, each from its own repo."""
    repos = {"chat": "poolserve-test/Qwen3.8-27B-NVFP4", "chat.speculative": "poolserve-test/Qwen3.8-27B-DSpark"}
    hub.repos[repos["chat"]] = repo_files(hub_config("qwen3.8-27b"))
    hub.repos[repos["chat.speculative"]] = repo_files(hub_config("qwen3.8-27b-dspark"))
    data = yaml.safe_load((ROOT / "configs/dgx-spark-27b.yaml").read_text())
    data.pop("tenants_file")
    data["embedder"]["model"] = str(ROOT / "models/all-MiniLM-L6-v2")
    for section, name in ((data["chat"], "target"), (data["chat"]["speculative"], "draft")):
        section["model"] = f"models/{name}"
    data["chat"]["hub"]["repo_id"], data["chat"]["speculative"]["hub"]["repo_id"] = repos.values()
    data["chat"]["hub"]["revision"] = COMMIT  # the profile pins the real repo's commit; the fake hub has its own
    profile = tmp_path / "spark-27b.yaml"
    profile.write_text(yaml.safe_dump(data))
    code, out = run_fetch(profile)
    assert code == 0, out
    assert "chat: config.json matches qwen3.8-27b.json" in out
    assert "chat.speculative: config.json matches qwen3.8-27b-dspark.json" in out
    assert (tmp_path / "models/target" / WEIGHTS[0]).exists() and (tmp_path / "models/draft" / WEIGHTS[1]).exists()


def test_hub_sources_in_the_schema():
    from pydantic import ValidationError

    from planner.profile import ChatSpec, SpeculativeSpec

    chat = ChatSpec(model_id="m", model="models/m", hub={"repo_id": "org/m", "revision": COMMIT})
    assert chat.hub.repo_id == "org/m" and chat.hub.revision == COMMIT
    assert ChatSpec(model_id="m", model="models/m").hub is None  # local folders stay as they were
    for bad in (
        {"repo_id": "org/m"},
        {"repo_id": "not a repo", "revision": "main"},
        {"repo_id": "org/m", "revision": "main", "token": "x"},
    ):
        with pytest.raises(ValidationError):
            ChatSpec(model_id="m", model="models/m", hub=bad)
    with pytest.raises(ValidationError, match="speculative.hub needs speculative.model"):
        SpeculativeSpec(method="dspark", hub={"repo_id": "org/d", "revision": "main"})
    spark = load_profile(ROOT / "configs/dgx-spark-27b.yaml")
    assert spark.chat.hub.repo_id == "nvidia/Qwen3.8-27B-NVFP4"
    assert spark.chat.hub.revision == "482ca0f3832238542f8f5295dde86b5f22711d80"
    assert spark.chat.speculative.hub.repo_id == "RadixArk/Qwen3.8-27B-DSpark"


def test_spark_profiles_name_the_real_checkpoints_at_pinned_commits():
    """The public repo ids (docs/SPARK.md section 2): no placeholder id under Qwen/ is left in configs/, and
    every target checkpoint is pinned to a 40-hex commit."""
    for path in sorted((ROOT / "configs").glob("dgx-spark*.yaml")):
        chat = load_profile(path).chat
        assert chat.hub.repo_id.split("/")[0] == "nvidia", path.name
        assert re.fullmatch(r"[0-9a-f]{40}", chat.hub.revision), path.name
        assert "Qwen/" not in path.read_text(), path.name
