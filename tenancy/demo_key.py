"""The demo tenant's key: from the environment, else a file in the state dir (0600), else new."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

from system.private_files import tighten_private, write_private
from tenancy.keys import generate_api_key, parse_api_key

DEMO_KEY_ENV = "POOLSERVE_DEMO_KEY"
DEMO_KEY_FILENAME = "demo-api-key"


def resolve_demo_key(state_dir: str | Path, environ: Mapping[str, str] | None = None) -> tuple[str, Path | None]:
    """Return ``(key, path)``; ``path`` is set only when the key was generated now.

    The caller prints that path (not the key) so the operator knows where the
    new key lives. An existing file is re-restricted to mode 0600 in case it
    was copied or created with a looser mode.
    """
    env = os.environ if environ is None else environ
    from_env = env.get(DEMO_KEY_ENV, "").strip()
    if from_env:
        return from_env, None

    key_path = Path(state_dir) / DEMO_KEY_FILENAME
    existing = _read_key_file(key_path)
    if existing is not None:
        return existing, None

    key_path.parent.mkdir(parents=True, exist_ok=True)
    api_key = generate_api_key()
    try:
        # Exclusive: if another replica wins the race, use its key instead of overwriting it.
        write_private(key_path, api_key + "\n", exclusive=True)
    except FileExistsError:
        # Another replica created it first and may still be writing it: give it a moment.
        for _ in range(50):
            raced = _read_key_file(key_path)
            if raced is not None:
                return raced, None
            time.sleep(0.1)
        raise RuntimeError(f"{key_path} exists but holds no key") from None
    return api_key, key_path


def _read_key_file(key_path: Path) -> str | None:
    """The key stored in ``key_path``; None if the file is missing or empty."""
    try:
        tighten_private(key_path)
        content = key_path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    if not content:
        return None
    try:
        parse_api_key(content)
    except ValueError as error:
        raise ValueError(f"{key_path} does not hold a valid key: {error}") from None
    return content
