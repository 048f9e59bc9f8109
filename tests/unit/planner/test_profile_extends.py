"""A profile that `extends` another names only what differs (planner/profile_file.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from planner.profile import load_profile
from planner.profile_file import merged, read_profile_data

ROOT = Path(__file__).resolve().parents[3]


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def test_mappings_merge_and_everything_else_replaces():
    base = {"a": {"x": 1, "y": [1, 2]}, "b": 1, "c": "keep"}
    over = {"a": {"y": [3], "z": 2}, "b": {"now": "a mapping"}}
    assert merged(base, over) == {"a": {"x": 1, "y": [3], "z": 2}, "b": {"now": "a mapping"}, "c": "keep"}
    assert base == {"a": {"x": 1, "y": [1, 2]}, "b": 1, "c": "keep"}  # the base is not changed


def test_a_chain_of_extends_resolves_relative_to_each_file(tmp_path):
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "root.yaml", {"name": "root", "embedder": {"batch_size": 4, "model": "m"}})
    _write(tmp_path / "sub" / "middle.yaml", {"extends": "../root.yaml", "embedder": {"batch_size": 8}})
    _write(tmp_path / "sub" / "leaf.yaml", {"extends": "middle.yaml", "name": "leaf"})
    assert read_profile_data(tmp_path / "sub" / "leaf.yaml") == {
        "name": "leaf",
        "embedder": {"batch_size": 8, "model": "m"},
    }


def test_a_loop_a_missing_base_and_a_bad_value_are_named(tmp_path):
    _write(tmp_path / "a.yaml", {"extends": "b.yaml"})
    _write(tmp_path / "b.yaml", {"extends": "a.yaml"})
    with pytest.raises(ValueError, match="loops back.*a.yaml -> b.yaml -> a.yaml"):
        read_profile_data(tmp_path / "a.yaml")
    _write(tmp_path / "c.yaml", {"extends": "nowhere.yaml"})
    with pytest.raises(FileNotFoundError, match="nowhere.yaml does not exist \\(extended by .*c.yaml\\)"):
        read_profile_data(tmp_path / "c.yaml")
    _write(tmp_path / "d.yaml", {"extends": ["a.yaml", "b.yaml"]})
    with pytest.raises(ValueError, match="must name one profile file"):
        read_profile_data(tmp_path / "d.yaml")
    (tmp_path / "e.yaml").write_text("- a list\n")
    with pytest.raises(ValueError, match="not a mapping"):
        read_profile_data(tmp_path / "e.yaml")


def test_cpu_mpnet_is_cpu_tiny_but_for_its_embedder_and_state():
    tiny, mpnet = load_profile(ROOT / "configs/cpu-tiny.yaml"), load_profile(ROOT / "configs/cpu-mpnet.yaml")
    assert (mpnet.name, mpnet.embedder.model_id, mpnet.embedder.max_seq_tokens) == (
        "cpu-mpnet",
        "all-mpnet-base-v2",
        384,
    )
    assert mpnet.state_dir != tiny.state_dir
    assert mpnet.embedder.batch_size == tiny.embedder.batch_size  # inherited, not copied
    differ = {key for key in tiny.model_dump() if tiny.model_dump()[key] != mpnet.model_dump()[key]}
    assert differ == {"name", "state_dir", "embedder"}


def test_a_profile_elsewhere_extends_one_in_configs_with_each_files_paths_its_own(tmp_path):
    mine = _write(
        tmp_path / "mine.yaml",
        {"extends": str(ROOT / "configs/cpu-tiny.yaml"), "name": "mine", "tenants_file": "tenants.yaml"},
    )
    profile = load_profile(mine)
    assert profile.embedder.model == str(ROOT / "models/all-MiniLM-L6-v2")  # cpu-tiny's, against the project root
    assert profile.tenants_file == str(tmp_path / "tenants.yaml")  # mine, against my folder
    assert profile.state_dir == str(ROOT / "var")  # cpu-tiny's "var", as cpu-tiny itself runs it
    assert load_profile(_write(tmp_path / "own.yaml", {"extends": "mine.yaml", "state_dir": "state"})).state_dir == str(
        tmp_path / "state"
    )
