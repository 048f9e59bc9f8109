"""Reading a profile file: its YAML, with `extends:` resolved.

`extends: cpu-tiny.yaml` (a path relative to the extending file's folder) starts from that profile and
lays this file's keys over it: mappings merge key by key, any other value (a list, a number, a string)
replaces the base's whole. So a variant names only what differs (configs/cpu-mpnet.yaml: the embedder
and the state dir) and follows every later change to its base. A base may extend another. Relative paths
(models, state_dir, tenants_file) mean what they mean in the file that names them (planner.profile.load_profile).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

MAX_EXTENDS_DEPTH = 8  # a chain deeper than this is a loop, or a mistake


def merged(base: dict, override: dict) -> dict:
    """override laid over base: nested mappings merge, everything else replaces."""
    result = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


def read_profile_data(
    path: str | Path, prepare: Callable[[dict, Path], dict] | None = None, _chain: tuple[Path, ...] = ()
) -> dict:
    """The profile at path as one mapping, every `extends:` above it merged in. `prepare(data, file)` is
    applied to each file's own mapping before the merge (planner/profile.py: its paths made absolute against
    that file's root)."""
    path = Path(path)
    if not path.exists():
        where = f" (extended by {_chain[-1]})" if _chain else ""
        raise FileNotFoundError(f"profile {path} does not exist{where}")
    resolved = path.resolve()
    if resolved in _chain:
        raise ValueError(
            f"profile {path}: `extends` loops back to itself ({' -> '.join(p.name for p in (*_chain, resolved))})"
        )
    if len(_chain) >= MAX_EXTENDS_DEPTH:
        raise ValueError(f"profile {path}: more than {MAX_EXTENDS_DEPTH} levels of `extends`")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"profile {path} is not a mapping of settings")
    base_name = data.pop("extends", None)
    if base_name is not None and (not isinstance(base_name, str) or not base_name.strip()):
        raise ValueError(f"profile {path}: `extends` must name one profile file, e.g. cpu-tiny.yaml")
    if prepare is not None:
        data = prepare(data, path)
    if base_name is None:
        return data
    return merged(read_profile_data(path.parent / base_name, prepare, (*_chain, resolved)), data)
