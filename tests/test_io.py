"""commsched.io: atomic writes leave the old file or the whole new one, and no temporary file."""

from __future__ import annotations

import pytest

from commsched.io import atomic_write_bytes, atomic_write_text


def test_atomic_write_text_and_bytes(tmp_path):
    path = tmp_path / "sub" / "a.txt"
    assert atomic_write_text(path, "héllo\n") == path  # parents are created
    assert path.read_text(encoding="utf-8") == "héllo\n"
    atomic_write_bytes(path, b"\x89PNG")
    assert path.read_bytes() == b"\x89PNG"
    assert [p.name for p in path.parent.iterdir()] == ["a.txt"]


def test_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "a.txt"
    atomic_write_text(path, "old")
    with pytest.raises(TypeError):
        atomic_write_bytes(path, "not bytes")  # type: ignore[arg-type]
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


# ---------------------------------------------------------------- issue 20 item 9: killed writers, symlinks
_KILLED_WRITER = """
import os, signal, sys
from commsched import io
os.replace = lambda src, dst: os.kill(os.getpid(), getattr(signal, sys.argv[2]))  # die between write and rename
io.atomic_write_text(sys.argv[1], "new")
"""


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_a_killed_writers_temp_file_is_removed_by_the_next_write(tmp_path, sig):
    import subprocess
    import sys

    path = tmp_path / "a.txt"
    atomic_write_text(path, "old")
    res = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(path), sig], capture_output=True, timeout=60)
    assert res.returncode < 0  # killed by the signal
    assert path.read_text() == "old"  # never half-written
    left = sorted(p.name for p in tmp_path.iterdir())
    assert len(left) == 2 and left[0].startswith(".a.txt.") and left[0].endswith(".tmp")
    atomic_write_text(path, "newer")
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"] and path.read_text() == "newer"


def test_a_live_writers_temp_file_is_kept(tmp_path):
    import os

    path = tmp_path / "a.txt"
    live = tmp_path / f".a.txt.{os.getpid()}.abc.tmp"
    live.write_text("in progress")
    atomic_write_text(path, "x")
    assert live.exists()


def test_writing_through_a_symlink_replaces_its_target(tmp_path):
    target = tmp_path / "data" / "real.json"
    target.parent.mkdir()
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    assert atomic_write_text(link, "new") == link
    assert link.is_symlink() and target.read_text() == "new"
    assert sorted(p.name for p in target.parent.iterdir()) == ["real.json"]


# ---------------------------------------------------------------- issue 19 item 9: written files get the umask's mode
def test_written_files_get_the_umasks_mode_and_replaced_files_keep_theirs(tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        fresh = atomic_write_text(tmp_path / "a.json", "{}")
        assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o644  # mkstemp alone gives 0600
        os.umask(0o027)
        assert stat.S_IMODE(os.stat(atomic_write_bytes(tmp_path / "b.png", b"x")).st_mode) == 0o640
        os.chmod(fresh, 0o664)
        atomic_write_text(fresh, "[]")  # replacing a file keeps its mode
        assert stat.S_IMODE(os.stat(fresh).st_mode) == 0o664
    finally:
        os.umask(old)


# ---------------------------------------------------------------- issue 36 item 1: only regular files are replaced
def _device_copy_of_dev_null(tmp_path):
    """A character device with /dev/null's numbers, in tmp_path (root only): what the writer must not replace."""
    import os
    import stat

    st = os.stat("/dev/null")
    path = tmp_path / "null"
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, st.st_rdev)
    except PermissionError:
        pytest.skip("making a device node needs root")
    return path


@pytest.mark.parametrize("kind", ["fifo", "directory", "device", "symlink to a fifo"])
def test_atomic_writes_refuse_what_is_not_a_regular_file_and_leave_it(tmp_path, kind):
    """Before: the rename put a file in place of a device, a FIFO (as root: /dev/full, /dev/null), and a directory
    gave IsADirectoryError's traceback. Now a ValueError names the path and what it is; nothing is changed."""
    import os
    import stat

    path = tmp_path / "out"
    if kind == "directory":
        path.mkdir()
        test, what = stat.S_ISDIR, "is a directory"
    elif kind == "device":
        path = _device_copy_of_dev_null(tmp_path)
        test, what = stat.S_ISCHR, "is a character device"
    else:
        os.mkfifo(tmp_path / "fifo")
        if kind == "fifo":
            path = tmp_path / "fifo"
        else:
            path.symlink_to(tmp_path / "fifo")
        test, what = stat.S_ISFIFO, "is a FIFO"
    for write in (lambda: atomic_write_text(path, "x"), lambda: atomic_write_bytes(path, b"x")):
        with pytest.raises(ValueError, match=what) as exc:
            write()
        assert str(path) in str(exc.value)
        assert test(os.stat(path).st_mode)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_output_checks_name_a_parent_that_is_a_file(tmp_path):
    from commsched.io import check_output_dir, check_output_file

    (tmp_path / "f").write_text("keep")
    for check in (check_output_file, check_output_dir):
        with pytest.raises(ValueError, match="is a regular file, not a folder"):
            check(tmp_path / "f" / "sub" / "x.json")
    with pytest.raises(ValueError, match="is a regular file; expected a folder"):
        check_output_dir(tmp_path / "f")
    assert check_output_dir(tmp_path / "new" / "dir") == tmp_path / "new" / "dir"
    assert (tmp_path / "f").read_text() == "keep"
