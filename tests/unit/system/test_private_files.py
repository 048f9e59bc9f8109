"""system/private_files.py: what is made is the owner's only, whatever the umask, and older files are tightened."""

import os
import stat

import pytest

from system.private_files import make_private_dir, open_private, tighten_private, touch_private, write_private


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def open_umask():
    """A umask that takes nothing away: the modes must come from the helpers, not from it."""
    previous = os.umask(0)
    yield
    os.umask(previous)


def test_write_private_makes_a_0600_file_and_returns_its_path(tmp_path, open_umask):
    path = tmp_path / "key"
    assert write_private(path, "secret\n", exclusive=True) == path
    assert path.read_text() == "secret\n" and _mode(path) == 0o600


def test_exclusive_write_never_overwrites(tmp_path):
    path = tmp_path / "key"
    write_private(path, "first\n", exclusive=True)
    with pytest.raises(FileExistsError):
        write_private(path, "second\n", exclusive=True)
    assert path.read_text() == "first\n"


def test_non_exclusive_write_truncates_and_tightens_an_older_0644_file(tmp_path):
    path = tmp_path / "key"
    path.write_text("an older and longer key\n")
    path.chmod(0o644)
    write_private(path, "new\n", exclusive=False)
    assert path.read_text() == "new\n" and _mode(path) == 0o600


def test_open_private_is_0600_before_anything_is_written(tmp_path, open_umask):
    path = tmp_path / "key"
    with open_private(path, exclusive=True) as handle:
        assert _mode(path) == 0o600 and path.read_text() == ""
        handle.write("k\n")
    assert path.read_text() == "k\n"


def test_open_private_passes_other_errors_through(tmp_path):
    with pytest.raises(FileNotFoundError):
        open_private(tmp_path / "no-such-folder" / "key", exclusive=True)


def test_touch_private_creates_empty_and_keeps_what_an_existing_file_holds(tmp_path, open_umask):
    fresh = touch_private(tmp_path / "db")
    assert fresh.read_bytes() == b"" and _mode(fresh) == 0o600
    old = tmp_path / "old.db"
    old.write_bytes(b"rows")
    old.chmod(0o644)
    touch_private(old)
    assert old.read_bytes() == b"rows" and _mode(old) == 0o600


def test_a_narrower_umask_cannot_make_the_mode_other_than_0600(tmp_path):
    previous = os.umask(0o277)  # would leave a new file 0400
    try:
        write_private(tmp_path / "key", "k", exclusive=True)
        touch_private(tmp_path / "db")
    finally:
        os.umask(previous)
    assert _mode(tmp_path / "key") == 0o600 and _mode(tmp_path / "db") == 0o600


def test_tighten_private_says_whether_the_file_exists(tmp_path):
    path = tmp_path / "db-wal"
    assert tighten_private(path) is False and not path.exists()
    path.write_bytes(b"")
    path.chmod(0o666)
    assert tighten_private(path) is True and _mode(path) == 0o600


def test_make_private_dir_creates_0700_and_leaves_an_existing_folder_alone(tmp_path, open_umask):
    made = make_private_dir(tmp_path / "a" / "state")
    assert made.is_dir() and _mode(made) == 0o700
    assert make_private_dir(made) == made  # exists already: no error
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    make_private_dir(shared)
    assert _mode(shared) == 0o755
