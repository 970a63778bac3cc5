"""Small shared I/O: atomic file writes (the bytes go to a temporary file in the target's folder, then a rename puts it
in place, so a reader sees either the old file or the whole new one, never a partial write; only over a regular file
or nothing, never over a device, FIFO, socket or directory), the one way an input
file is read (:func:`read_input_bytes`, :func:`read_input_text`, :func:`read_input_json`: size-capped, gzip when it
is gzip, strict UTF-8 and JSON, every failure a ValueError naming the file), a free local port for a rendezvous and
whether a process is alive (:func:`pid_alive`)."""

from __future__ import annotations

import gzip
import io
import json
import os
import socket
import stat
import tempfile
import zlib
from pathlib import Path
from typing import Any

MAX_INPUT_BYTES = 1 << 31
"""the most bytes an input file may hold (after gzip decompression): 2 GiB; a device such as /dev/zero stops here"""
_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20


def _read_capped(fh: Any, path: Path, cap: int) -> bytes:
    """Up to ``cap`` bytes of an open stream; ValueError when it holds more."""
    parts, total = [], 0
    while True:
        chunk = fh.read(min(_CHUNK, cap + 1 - total))
        if not chunk:
            return b"".join(parts)
        parts.append(chunk)
        total += len(chunk)
        if total > cap:
            raise ValueError(f"{path}: larger than {cap} bytes; expected an input file of at most that size")


def read_input_bytes(path: str | os.PathLike[str], what: str = "input") -> bytes:
    """The bytes of an input file (a gzip file decompressed), at most :data:`MAX_INPUT_BYTES`.
    FileNotFoundError or ValueError, each naming the file: a directory, unreadable, too large, a broken gzip."""
    path = Path(path)
    cap = MAX_INPUT_BYTES
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise ValueError(f"{path}: is a directory; expected a {what} file")
        if stat.S_ISREG(st.st_mode) and st.st_size > cap:
            raise ValueError(f"{path}: {st.st_size} bytes; expected a {what} file of at most {cap} bytes")
        with open(path, "rb") as fh:
            data = _read_capped(fh, path, cap)
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not data.startswith(_GZIP_MAGIC):
        return data
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as fh:
            return _read_capped(fh, path, cap)
    except (OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"{path}: a broken gzip file ({exc or type(exc).__name__}); expected a whole {what}") from None


def read_input_text(path: str | os.PathLike[str], what: str = "input") -> str:
    """An input file as strict UTF-8 text (see :func:`read_input_bytes`); ValueError naming the file and the byte."""
    data = read_input_bytes(path, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: byte {exc.start} is not UTF-8 ({exc.reason}); expected a UTF-8 {what}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str, where: str, what: str = "input") -> Any:
    """Strict JSON (no NaN / Infinity, bounded nesting); ValueError naming ``where``."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON: {exc}") from None
    except RecursionError:
        raise ValueError(f"{where}: JSON nested too deeply; expected a {what}") from None
    except ValueError as exc:  # NaN / Infinity, an integer of more than 4300 digits
        raise ValueError(f"{where}: not valid JSON: {exc}") from None


def read_input_json(path: str | os.PathLike[str], what: str = "input") -> Any:
    """An input file parsed as strict JSON (:func:`read_input_text`, :func:`parse_json`)."""
    return parse_json(read_input_text(path, what), str(path), what)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (another user's counts): what tells a leftover of a killed
    writer or run (a temporary file, a network namespace) from one still in use."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def _remove_stale_temps(path: Path) -> None:
    """Delete the temporary files that writers of ``path`` left when they were killed (their process is gone)."""
    prefix = f".{path.name}."
    try:
        names = [n for n in os.listdir(path.parent) if n.startswith(prefix) and n.endswith(".tmp")]
    except OSError:
        return
    for name in names:
        pid = name[len(prefix) :].split(".", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            (path.parent / name).unlink(missing_ok=True)


def _umask() -> int:
    """The process's umask, read without changing it where Linux allows (``/proc/self/status``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (not atomic against another thread's umask change)
    os.umask(mask)
    return mask


def _mode_for(path: Path) -> int:
    """The permission bits a written file gets: an existing file's own, else ``0o666`` less the umask (what
    ``open(path, "w")`` would give; ``mkstemp`` alone gives 0600)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~_umask()


def path_kind(mode: int) -> str:
    """What a file of ``st_mode`` is, in words ("a directory", "a character device", ...)."""
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file"))  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def check_output_file(path: str | os.PathLike[str]) -> Path:
    """The file an atomic write of ``path`` would replace (a symlink followed), if it may be written: a regular
    file, or a path that does not exist yet whose nearest existing folder is a folder. Anything else (a device such
    as /dev/null, a FIFO, a socket, a directory) is a ValueError naming the path and what it is: the rename would
    put a file in its place. Called by every atomic write, and by the CLI for each output option before any work."""
    return _check_output(path, stat.S_ISREG, "a regular file")


def check_output_dir(path: str | os.PathLike[str]) -> Path:
    """An output folder (created when missing): a ValueError naming ``path`` when it exists and is not a folder, or
    when a parent is not one. The files written into it are each checked by the atomic writer."""
    return _check_output(path, stat.S_ISDIR, "a folder")


def _check_output(path: str | os.PathLike[str], is_wanted, wanted: str) -> Path:
    """``path`` resolved, if it is missing (under a folder) or ``is_wanted(st_mode)``; else the one-line error."""
    target = Path(os.path.realpath(path))
    try:
        mode = os.stat(target).st_mode
    except (FileNotFoundError, NotADirectoryError):  # missing, or under a file: the parent check says which
        _check_parent_folder(path, target.parent)
        return target
    except OSError as exc:
        raise ValueError(f"{path}: cannot write: {exc.strerror or exc}") from None
    if not is_wanted(mode):
        raise ValueError(f"{path}: is {path_kind(mode)}; expected {wanted} or a path that does not exist yet")
    return target


def _check_parent_folder(given: str | os.PathLike[str], parent: Path) -> None:
    """The nearest existing ancestor of a path to be created must be a folder (``mkdir`` would fail)."""
    for folder in (parent, *parent.parents):
        try:
            mode = os.stat(folder).st_mode
        except (FileNotFoundError, NotADirectoryError):  # missing, or under a file: the parent check says which
            continue
        except OSError as exc:
            raise ValueError(f"{given}: cannot write: {exc.strerror or exc}") from None
        if not stat.S_ISDIR(mode):
            raise ValueError(f"{given}: {folder} is {path_kind(mode)}, not a folder")
        return


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` (parents created) through a temporary file and a rename; returns the path.

    The file gets the mode ``open(path, "w")`` would give it: a replaced file keeps its mode, a new one gets
    ``0o666`` less the umask (0644 under the usual umask 022).

    A symlink at ``path`` is followed: its target is replaced, the link stays. The temporary file is
    ``.NAME.PID.RANDOM.tmp`` next to the target; one that a killed writer left behind (SIGKILL, SIGTERM: no cleanup
    runs) is deleted by the next write to the same file.

    Only a regular file (or a path that does not exist yet) is written: a device, FIFO, socket or directory at
    ``path`` is a ValueError (:func:`check_output_file`) and is left as it is."""
    given = Path(path)
    path = check_output_file(given)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, _mode_for(path))
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        check_output_file(path)  # again, just before the rename: something else may have appeared there meanwhile
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)  # never leave a stray temporary file behind
        raise
    return given


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` as UTF-8 to ``path`` atomically (see ``atomic_write_bytes``); returns the path."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (for a local process-group rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
