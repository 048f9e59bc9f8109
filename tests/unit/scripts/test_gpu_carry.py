"""scripts/gpu_carry.sh N: the paths transfer N carries, with the kernel-cache part an earlier session saved
(`.gpucacheN`, scripts/gpu_cache.sh) beside bundle part N when there is one; run on a stand-in checkout."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _checkout(tmp_path: Path, parts: int) -> Path:
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "gpu_carry.sh", tmp_path / "scripts")
    bundle = tmp_path / ".gpuparts"
    bundle.mkdir()
    for index in range(parts):
        (bundle / f"part.{index}").write_bytes(b"x")
    (bundle / "parts.sha256").write_text("".join(f"0  part.{index}\n" for index in range(parts)))
    for name in ("bundle.sha256", "stage_and_install.sh"):
        (bundle / name).write_text("")
    return tmp_path


def _carry(checkout: Path, transfer: int) -> list[str]:
    done = subprocess.run(
        ["bash", str(checkout / "scripts" / "gpu_carry.sh"), str(transfer)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return json.loads(done.stdout)


def test_each_transfer_carries_its_bundle_part_and_the_cache_part_of_the_same_number(tmp_path):
    checkout = _checkout(tmp_path, parts=3)
    (checkout / ".gpucache0").mkdir()
    (checkout / ".gpucache2").mkdir()
    first = _carry(checkout, 0)
    assert first[0] == ".gpustage" and "models/gpu/Qwen3.8-27B-dummy" in first and first[-1] == ".gpucache0"
    assert (checkout / ".gpustage" / "part.0").exists()
    assert _carry(checkout, 1) == [".gpustage"]  # no cache part 1: nothing more
    last = _carry(checkout, 2)
    assert last == [".gpustage", ".whl", ".gpucache2"]  # the chat models travelled with the first part
    assert not (checkout / ".gpustage" / "part.0").exists()  # one bundle part a transfer


def _git_checkout(tmp_path: Path, parts: int) -> Path:
    """The stand-in as a git work tree that ignores the staging folders, as .git/info/exclude does here: what
    travels with a transfer is then what git lists."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    checkout = _checkout(tmp_path, parts)
    subprocess.run(["git", "init", "-q", str(checkout)], check=True, timeout=30)
    (checkout / ".git" / "info" / "exclude").write_text("/.gpustage/\n/.gpuparts/\n/.gpucache*/\n/.mpnet*/\n")
    return checkout


def test_a_cache_part_that_would_not_fit_beside_the_bundle_part_is_left_for_its_own_transfer(tmp_path):
    checkout = _git_checkout(tmp_path, parts=2)
    (checkout / ".gpucache0").mkdir()
    (checkout / ".gpucache0" / "gpucache.tgz.part0").write_bytes(b"x" * 1024)
    with open(checkout / "checkout.bin", "wb") as big:  # the checkout 600 bytes short of 64 MiB (sparse)
        big.truncate(64 * 1024 * 1024 - (checkout / "scripts" / "gpu_carry.sh").stat().st_size - 600)
    done = subprocess.run(
        ["bash", str(checkout / "scripts" / "gpu_carry.sh"), "0"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0 and ".gpucache0" not in json.loads(done.stdout)
    assert "gpu_carry.sh caches" in done.stderr
    (checkout / "checkout.bin").unlink()
    assert _carry(checkout, 0)[-1] == ".gpucache0"
    caches = subprocess.run(
        ["bash", str(checkout / "scripts" / "gpu_carry.sh"), "caches"], capture_output=True, text=True, timeout=30
    )
    assert json.loads(caches.stdout) == [".gpucache0"]


def _join(checkout: Path, stash: Path) -> subprocess.CompletedProcess:
    shutil.copy(ROOT / "scripts" / "gpu_env.sh", checkout / "scripts")
    return subprocess.run(
        ["bash", "-c", ". scripts/gpu_env.sh"],
        cwd=checkout,
        env={"PATH": "/usr/bin:/bin", "GPU_STASH": str(stash)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_mpnet_copy_travels_in_parts_and_is_joined_only_when_whole(tmp_path):
    checkout = _git_checkout(tmp_path / "here", parts=1)
    model = checkout / "models" / "gpu" / "all-mpnet-base-v2-fp16"
    (model / "1_Pooling").mkdir(parents=True)
    weights = bytes(range(256)) * 4 + b"end"
    (model / "model.safetensors").write_bytes(weights)
    (model / "config.json").write_text('{"model_type": "mpnet"}')
    (model / "1_Pooling" / "config.json").write_text("{}")
    done = subprocess.run(
        ["bash", str(checkout / "scripts" / "gpu_carry.sh"), "mpnet"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "MPNET_PART_BYTES": "300"},
        check=True,
    )
    transfers = [json.loads(line) for line in done.stdout.splitlines()]
    assert transfers == [[f".mpnet{index}"] for index in range(4)]  # 1,027 bytes in parts of 300
    # The machine: a fresh checkout that gathers each transfer's part in one folder, as its commands do.
    # The machine: each transfer's checkout holds its part; gpu_env.sh keeps the parts in the stash.
    stash = tmp_path / "stash"
    for index in range(3):
        there = _git_checkout(tmp_path / f"transfer{index}", parts=1)
        shutil.copytree(checkout / f".mpnet{index}", there / f".mpnet{index}")
        _join(there, stash)
    assert not (stash / "gpumodels" / "all-mpnet-base-v2-fp16" / "model.safetensors").exists()  # one missing
    (stash / "mpnet" / "model.safetensors.part3").write_bytes(b"damaged")
    damaged = _join(there, stash)
    assert "damaged" in damaged.stderr
    assert not (stash / "gpumodels" / "all-mpnet-base-v2-fp16" / "model.safetensors").exists()
    there = _git_checkout(tmp_path / "transfer3", parts=1)
    shutil.copytree(checkout / ".mpnet3", there / ".mpnet3")
    joined = _join(there, stash)
    assert "mpnet joined" in joined.stdout
    later = _git_checkout(tmp_path / "run", parts=1)  # a run's checkout, carrying nothing: the model is linked
    _join(later, stash)
    copy = later / "models" / "gpu" / "all-mpnet-base-v2-fp16"
    assert (copy / "model.safetensors").read_bytes() == weights
    assert (copy / "1_Pooling" / "config.json").read_text() == "{}"


def test_models_carried_once_are_linked_into_every_later_checkout(tmp_path):
    stash = tmp_path / "stash"
    staging = _git_checkout(tmp_path / "staging", parts=1)
    chat = staging / "models" / "gpu" / "Qwen3.8-27B-dummy"
    chat.mkdir(parents=True)
    (chat / "tokenizer.json").write_text("{}")
    (staging / "models" / "gpu" / "Qwen3.8-27B-DSpark-dummy").mkdir()
    (staging / "models" / "gpu" / "Qwen3.8-27B-DSpark-dummy" / "config.json").write_text("{}")
    _join(staging, stash)
    run = _git_checkout(tmp_path / "run", parts=1)
    _join(run, stash)
    assert (run / "models" / "gpu" / "Qwen3.8-27B-dummy" / "tokenizer.json").read_text() == "{}"
    assert (run / "models" / "gpu" / "Qwen3.8-27B-DSpark-dummy" / "tokenizer.json").exists()  # given the target's
