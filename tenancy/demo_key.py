"""The demo tenant's key (from the environment, else a file in the state dir, else new),
and the owner-only file modes that key file and the tenants database share."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Mapping
from pathlib import Path

from tenancy.keys import generate_api_key, parse_api_key

DEMO_KEY_ENV = "POOLSERVE_DEMO_KEY"
DEMO_KEY_FILENAME = "demo-api-key"
_OWNER_ONLY = 0o600


def resolve_demo_key(state_dir: str | Path,
                     environ: Mapping[str, str] | None = None) -> tuple[str, Path | None]:
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
        # O_EXCL: if another replica wins the race, use its key instead of overwriting it.
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _OWNER_ONLY)
    except FileExistsError:
        # Another replica created it first and may still be writing it: give it a moment.
        for _ in range(50):
            raced = _read_key_file(key_path)
            if raced is not None:
                return raced, None
            time.sleep(0.1)
        raise RuntimeError(f"{key_path} exists but holds no key") from None
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        os.fchmod(handle.fileno(), _OWNER_ONLY)  # the umask could only narrow it, but be exact
        handle.write(api_key + "\n")
    return api_key, key_path


def restrict_to_owner(path: str | Path, create: bool = False) -> bool:
    """Make ``path`` mode 0600, creating it empty with that mode first if ``create``.

    Returns whether the file exists; a missing file is not an error.
    """
    if create:
        # The mode applies only when the file is created; the umask can only narrow it.
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, _OWNER_ONLY))
    try:
        if stat.S_IMODE(os.stat(path).st_mode) != _OWNER_ONLY:
            os.chmod(path, _OWNER_ONLY)
    except FileNotFoundError:
        return False
    return True


def _read_key_file(key_path: Path) -> str | None:
    """The key stored in ``key_path``; None if the file is missing or empty."""
    try:
        restrict_to_owner(key_path)
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
