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
    assert _carry(checkout, 0) == [".gpustage", ".gpucache0"]
    assert (checkout / ".gpustage" / "part.0").exists()
    assert _carry(checkout, 1) == [".gpustage"]  # no cache part 1: nothing more
    last = _carry(checkout, 2)
    assert last[0] == ".gpustage" and ".whl" in last and last[-1] == ".gpucache2"
    assert not (checkout / ".gpustage" / "part.0").exists()  # one bundle part a transfer
