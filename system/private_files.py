"""Files and folders only their owner can read: keys, tokens, the SQLite databases.

A mode given to open/mkdir applies only to what is created, and the umask can only narrow it;
so files are created 0600 and then chmod-ed, which also tightens one an older version (or a copy)
left 0644. Folders are created 0700; an existing folder is left as it is.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TextIO

OWNER_ONLY_FILE = 0o600
OWNER_ONLY_DIR = 0o700


def make_private_dir(path: str | Path) -> Path:
    """Create the folder (and its parents) if missing; the folder itself is made 0700."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True, mode=OWNER_ONLY_DIR)
    return folder


def tighten_private(path: str | Path) -> bool:
    """Make an existing file 0600; returns whether it exists (a missing file is not an error)."""
    try:
        # chmod only when needed: a file that is already right needs no ownership to stay right.
        if stat.S_IMODE(os.stat(path).st_mode) != OWNER_ONLY_FILE:
            os.chmod(path, OWNER_ONLY_FILE)
    except FileNotFoundError:
        return False
    return True


def touch_private(path: str | Path) -> Path:
    """Create the file empty and 0600 if missing (never truncating one that exists), and make it 0600."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, OWNER_ONLY_FILE))
    tighten_private(path)
    return Path(path)


def open_private(path: str | Path, exclusive: bool) -> TextIO:
    """A file open for writing text, 0600 before anything is written into it.

    exclusive: create it or fail with FileExistsError (O_EXCL: of two racing writers one wins);
    otherwise an existing file is truncated and tightened. Other OSErrors pass through as they are.
    """
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, OWNER_ONLY_FILE)
    try:
        os.fchmod(fd, OWNER_ONLY_FILE)  # exact despite the umask; tightens an old file
        return os.fdopen(fd, "w", encoding="utf-8")
    except BaseException:
        os.close(fd)
        raise


def write_private(path: str | Path, text: str, exclusive: bool) -> Path:
    """Write `text` into a 0600 file (see open_private for `exclusive`); returns the path."""
    with open_private(path, exclusive) as handle:
        handle.write(text)
    return Path(path)
