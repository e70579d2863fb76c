"""Small I/O helpers shared by every command: strict UTF-8 text reading and atomic writes."""

from __future__ import annotations

import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

from nmt.errors import NmtError


def _decode_line(raw: bytes, name: str, lineno: int) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise NmtError(f"{name}: line {lineno}: invalid UTF-8 at byte {e.start}") from None
    # Only the line terminator is stripped; other whitespace is data.
    if text.endswith("\n"):
        text = text[:-1]
        if text.endswith("\r"):
            text = text[:-1]
    return text


def iter_lines(path: str | os.PathLike | None, name: str | None = None) -> Iterator[str]:
    """Yield the lines of a UTF-8 file (or stdin for None or '-') without terminators.

    Invalid UTF-8 raises NmtError naming the file and the 1-based line number.
    """
    if path is None or str(path) == "-":
        yield from iter_stream(sys.stdin.buffer, name or "<stdin>")
        return
    p = check_readable(path, name=name)
    label = name or str(p)
    try:
        f = open(p, "rb")
    except OSError as e:
        raise NmtError(f"{label}: cannot read ({e.strerror})") from None
    with f:
        yield from iter_stream(f, label)


def iter_stream(stream: IO[bytes], name: str) -> Iterator[str]:
    for lineno, raw in enumerate(stream, 1):
        yield _decode_line(raw, name, lineno)


def stream_batches(fd: int, max_lines: int, name: str = "<stdin>",
                   read_size: int = 1 << 16) -> Iterator[list[str]]:
    """Lines of the file descriptor ``fd`` (a pipe, a terminal, a file), in batches: a batch
    ends at ``max_lines`` lines, or earlier when no more input is pending, so that a caller who
    writes one line and waits for its answer gets it, while a fast producer still fills whole
    batches. A last line without a terminator counts; invalid UTF-8 raises NmtError naming the
    line. (Unbuffered reads: do not mix with reads of the same stream through sys.stdin.)"""
    import select

    buf, pending, lineno = b"", [], 0
    while True:
        data = os.read(fd, read_size)
        if data:
            buf += data
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                lineno += 1
                pending.append(_decode_line(raw + b"\n", name, lineno))
        elif buf:
            lineno += 1
            pending.append(_decode_line(buf, name, lineno))
            buf = b""
        while pending and (len(pending) >= max_lines or not data or
                           not select.select([fd], [], [], 0)[0]):
            yield pending[:max_lines]
            pending = pending[max_lines:]
        if not data:
            return


def read_lines(path: str | os.PathLike | None, name: str | None = None) -> list[str]:
    return list(iter_lines(path, name))


def check_readable(path: str | os.PathLike, what: str = "file", *,
                   expected: str = "a text file", name: str | None = None) -> Path:
    """``path`` as a Path if it is a readable file, else a one-line NmtError naming it
    (``name`` if given): "no such WHAT", "is a directory, expected EXPECTED" or
    "permission denied". Lets a command refuse bad input before it starts real work."""
    p = Path(path)
    label = name or str(p)
    if not p.exists():
        raise NmtError(f"{label}: no such {what}")
    if p.is_dir():
        raise NmtError(f"{label}: is a directory, expected {expected}")
    if not os.access(p, os.R_OK):
        raise NmtError(f"{label}: permission denied")
    return p


def temporary_directory_beside(dest: Path, what: str) -> Path:
    """A new private directory in ``dest``'s parent (created if needed), where ``what`` (e.g.
    "data directory") is built before :func:`install_directory` renames it to ``dest``."""
    import tempfile

    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    except OSError as e:
        raise NmtError(f"{dest}: cannot create the {what} ({e.strerror or e})") from None


def install_directory(tmp: Path, dest: Path, what: str, fsync_files: bool = False) -> None:
    """Rename the finished temporary directory ``tmp`` to ``dest``, replacing an old one so
    that ``dest`` is never half-replaced (the old one is moved aside first). mkdtemp/mkstemp
    make private (0700/0600) entries; what is installed is ordinary data, so the modes follow
    the umask. ``fsync_files``: also flush every file to disk before the rename."""
    import shutil
    import tempfile

    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)
    for f in tmp.iterdir():
        os.chmod(f, 0o666 & ~umask)
        if fsync_files:
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    fsync_dir(tmp)
    try:
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
            os.replace(dest, old / dest.name)
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except OSError as e:
        raise NmtError(f"{dest}: cannot install the {what} ({e.strerror or e})") from None
    fsync_dir(dest.parent)


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """Write to a temporary file beside ``path``, fsync it, then rename it into place.

    A crash at any moment leaves either the old file or the new one, never a partial file.
    Disk-full and permission errors become NmtError naming the destination.
    """
    dest = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    except OSError as e:
        raise NmtError(f"{dest}: cannot write ({e.strerror})") from None
    try:
        # mkstemp creates the file 0600; give it the permissions a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, dest)
        fsync_dir(dest.parent)
    except OSError as e:
        _unlink_quietly(tmp)
        raise NmtError(f"{dest}: cannot write ({e.strerror or e})") from None
    except BaseException:
        _unlink_quietly(tmp)
        raise


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_write(path, "w") as f:
        f.write(text)


class LineWriter:
    """Writes output lines to stdout or a file, flushing per batch, UTF-8, '\\n' endings.

    A failure to write (full disk, quota, I/O error) is a one-line NmtError naming the output,
    wherever it shows: at a write, at a flush or at the flush of :meth:`close` (a redirected
    stdout is buffered, so a full disk often shows only there). A closed pipe stays
    BrokenPipeError (the commands stop quietly on it).
    """

    def __init__(self, path: str | os.PathLike | None):
        self.path = None if path in (None, "-") else Path(path)
        self.name = "<stdout>" if self.path is None else str(self.path)
        if self.path is None:
            self._f: IO[bytes] = sys.stdout.buffer
            self._own = False
        else:
            try:
                self._f = open(self.path, "wb")
            except OSError as e:
                raise NmtError(f"{self.path}: cannot write ({e.strerror})") from None
            self._own = True

    @contextmanager
    def _writing(self) -> Iterator[None]:
        try:
            yield
        except BrokenPipeError:
            raise
        except OSError as e:
            if not self._own:
                discard_stdout(self._f)
            raise NmtError(f"{self.name}: cannot write ({e.strerror or e})") from None

    def write(self, line: str) -> None:
        with self._writing():
            self._f.write(line.encode("utf-8") + b"\n")

    def flush(self) -> None:
        with self._writing():
            self._f.flush()

    def close(self) -> None:
        """Flush; close the file (stdout stays open)."""
        try:
            self.flush()
        finally:
            if self._own:
                try:
                    self._f.close()
                except OSError:
                    pass        # close retried the flush that has just failed and said why


def discard_stdout(stream: IO[bytes]) -> None:
    """After a failed write to stdout: what is left in its buffer can never be written; point
    the descriptor at /dev/null so that the interpreter's last flush does not fail (and print)
    a second time after the one-line error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError):       # no descriptor (an in-memory stream)
        pass
    finally:
        os.close(devnull)
