"""Small shared I/O: atomic file writes (the bytes go to a temporary file in the target's folder, then a rename puts it
in place, so a reader sees either the old file or the whole new one, never a partial write) and a free local port
for a rendezvous."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` (parents created) through a temporary file and a rename; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)  # never leave a stray temporary file behind
        raise
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` as UTF-8 to ``path`` atomically (see ``atomic_write_bytes``); returns the path."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (for a local process-group rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
