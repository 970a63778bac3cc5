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
