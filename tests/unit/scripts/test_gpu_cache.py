"""scripts/gpu_cache.sh: the GPU machine's kernel caches saved as checked parts and unpacked on the next machine;
an incomplete set unpacks nothing (the start is then cold, never half-warm). Run against a stand-in root."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "gpu_cache.sh"


def _run(verb: str, folder: Path, root: Path, code: int = 0) -> str:
    env = {**os.environ, "GPU_CACHE_ROOT": str(root)}
    done = subprocess.run(["bash", str(SCRIPT), verb, str(folder)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stderr
    return done.stdout


def test_the_caches_come_back_whole_on_a_fresh_root(tmp_path):
    machine, parts, fresh = tmp_path / "machine", tmp_path / "parts", tmp_path / "fresh"
    kernel = machine / "root/.triton/cache/abc/kernel.cubin"
    graph = machine / "tmp/torchinductor_root/fx/graph.py"
    for path, data in ((kernel, os.urandom(200_000)), (graph, b"def f(): pass\n")):
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
    _run("save", parts, machine)
    assert {p.name for p in parts.iterdir()} == {"gpucache.sha256", "gpucache.tgz.part0"}
    fresh.mkdir()
    assert "caches unpacked" in _run("load", parts, fresh)
    assert (fresh / "root/.triton/cache/abc/kernel.cubin").read_bytes() == kernel.read_bytes()
    assert (fresh / "tmp/torchinductor_root/fx/graph.py").read_bytes() == graph.read_bytes()


def test_a_damaged_or_missing_set_starts_cold(tmp_path):
    machine, parts, fresh = tmp_path / "machine", tmp_path / "parts", tmp_path / "fresh"
    (machine / "root/.triton/cache").mkdir(parents=True)
    (machine / "root/.triton/cache/k").write_bytes(b"x" * 1000)
    fresh.mkdir()
    assert "no carried cache" in _run("load", tmp_path / "nothing", fresh)
    _run("save", parts, machine)
    part = next(parts.glob("gpucache.tgz.part*"))
    part.write_bytes(part.read_bytes()[:-10])
    assert "starting cold" in _run("load", parts, fresh, code=3)  # gpu_env.sh loads again once whole
    assert not any(fresh.iterdir())
    assert "no cache to save" in _run("save", tmp_path / "empty", fresh)
