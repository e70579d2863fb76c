"""Small I/O helpers shared by every command: strict UTF-8 text reading and atomic writes."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator, Sequence

from nmt.errors import NmtError, UsageError

log = logging.getLogger("nmt.io")


BOM = "\ufeff"


def _decode_line(raw: bytes, name: str, lineno: int) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise NmtError(f"{name}: line {lineno}: invalid UTF-8 at byte {e.start}") from None
    # A byte-order mark opening a file (editors on Windows write one) is not text: left in, it
    # would glue itself to the first word (an unknown token, a BLEU n-gram that never
    # matches). Python's utf-8-sig drops it the same way; a U+FEFF inside the text stays.
    if lineno == 1 and text.startswith(BOM):
        text = text[1:]
        log.warning("%s: dropped the UTF-8 byte-order mark at its start (sacreBLEU's own "
                    "command line would keep it glued to the first word)", name)
    # Only the line terminator is stripped; other whitespace is data. A CR alone at the end is
    # a CRLF file's last line without its LF (a line can only lack its LF at the end).
    if text.endswith("\n"):
        text = text[:-1]
    if text.endswith("\r"):
        text = text[:-1]
    return text


def _open_binary(path: str | os.PathLike, name: str | None) -> tuple[IO[bytes], str]:
    """A readable file opened for bytes, with the name its errors use; one-line errors."""
    p = check_readable(path, name=name)
    label = name or str(p)
    try:
        return open(p, "rb"), label
    except OSError as e:
        raise NmtError(f"{label}: cannot read ({e.strerror})") from None


def iter_lines(path: str | os.PathLike | None, name: str | None = None) -> Iterator[str]:
    """Yield the lines of a UTF-8 file (or stdin for None or '-') without terminators.

    Invalid UTF-8 raises NmtError naming the file and the 1-based line number.
    """
    if path is None or str(path) == "-":
        yield from iter_stream(sys.stdin.buffer, name or "<stdin>")
        return
    f, label = _open_binary(path, name)
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


def iter_line_chunks(path: str | os.PathLike, max_lines: int, start: int = 0,
                     first_line: int = 1, name: str | None = None
                     ) -> Iterator[tuple[list[str], int]]:
    """The lines of a UTF-8 file from byte offset ``start`` (a line start; ``first_line`` is
    its 1-based number, for errors), ``max_lines`` at a time, each chunk with the byte offset
    just past it: memory holds one chunk whatever the file's size, and a caller that records
    the offset can continue there later (nmt-generate --output resumes so)."""
    f, label = _open_binary(path, name)
    with f:
        f.seek(start)
        offset, lineno, chunk = start, first_line, []
        for raw in f:
            chunk.append(_decode_line(raw, label, lineno))
            offset += len(raw)
            lineno += 1
            if len(chunk) >= max_lines:
                yield chunk, offset
                chunk = []
        if chunk:
            yield chunk, offset


def is_regular_file(path: str | os.PathLike) -> bool:
    """True for a regular file (one that can be read twice and seeked: not a pipe, a
    terminal, /dev/stdin or a process substitution)."""
    import stat

    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def file_key(path: str | os.PathLike) -> tuple[int, int] | None:
    """The file's identity, what os.path.samefile compares (links followed); None for a path
    that names no readable file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def file_record(path: str | os.PathLike) -> dict:
    """What a run records of an input file to tell later whether it is still the same one:
    its resolved path, size in bytes and modification time (raises OSError when it cannot
    be read)."""
    st = os.stat(path)
    return {"path": str(Path(path).resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


# --- outputs: never an input, never a file nmt did not write ---------------------------------

def written_record_path(path: str | os.PathLike) -> Path:
    """The hidden record beside an output file that says nmt wrote it (``.NAME.nmt-written``)."""
    p = Path(path)
    return p.with_name(f".{p.name}.nmt-written")


def mark_written(path: str | os.PathLike, identity: dict | None = None) -> None:
    """Record that nmt has just written ``path`` in full (its size, modification time and
    inode), with the run's identity when it has one (a rerun of it is then complete)."""
    try:
        st = os.stat(path)
    except OSError:
        return
    record = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino,
              "identity": identity}
    try:
        write_text_atomic(written_record_path(path), json.dumps(record) + "\n")
    except NmtError as e:        # the output itself is whole; only the record is missing
        log.warning("%s", e)


def written_record(path: str | os.PathLike) -> dict | None:
    """The record of mark_written() if ``path`` is still the file nmt wrote then, else None."""
    try:
        st = os.stat(path)
        record = json.loads(written_record_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or [record.get(k) for k in ("size", "mtime_ns", "inode")] \
            != [st.st_size, st.st_mtime_ns, st.st_ino]:
        return None
    return record


def check_output_file(path: str | os.PathLike | None, inputs: Sequence, overwrite: bool,
                      flag: str = "--output", resuming: bool = False) -> None:
    """Refuse an output file that is one of ``inputs`` (by identity: hard links, symbolic
    links, ./x; --overwrite does not change that), or an existing non-empty regular file that
    nmt did not write (no matching .NAME.nmt-written record) unless ``overwrite``; a run
    that is ``resuming`` its own interrupted output was let through before. stdout ("-"),
    FIFOs and devices are written through and never checked."""
    if path in (None, "-") or (os.path.exists(path) and not os.path.isfile(path)):
        return
    out_real, out_key = os.path.realpath(path), file_key(path)
    for given in inputs:
        if given in (None, "-"):
            continue
        if os.path.realpath(given) == out_real or (out_key is not None
                                                  and file_key(given) == out_key):
            raise UsageError(f"{flag} {path} is the input {given}, which writing the output "
                             f"would destroy; give another file")
    if resuming or overwrite or not os.path.isfile(path) or os.path.getsize(path) == 0:
        return
    if written_record(path) is None:
        raise UsageError(f"{flag} {path}: exists and was not written by nmt; add --overwrite "
                         f"to replace it, or give another file")


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
    "data directory") is built before :func:`install_directory` renames it to ``dest``.

    Its name records this host and process (``.DEST.tmp-HOST-PID-XXXXXXXX``), so that the
    temporaries of ``dest`` left by a process that has died (kill -9, a power cut) are
    recognised and removed here; those of live processes, and of other hosts sharing the
    file system, are left alone."""
    import tempfile

    prefix = f".{dest.name}.tmp-{_host()}-"
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(dest.parent, prefix)
        return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=dest.parent))
    except OSError as e:
        raise NmtError(f"{dest}: cannot create the {what} ({e.strerror or e})") from None


def _host() -> str:
    import socket

    # Only characters that are safe in a file name; the name is matched exactly, not parsed.
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def _remove_stale_temporaries(parent: Path, prefix: str) -> None:
    import shutil

    for entry in parent.iterdir():
        # mkdtemp's suffix: 8 characters of [a-z0-9_]
        m = re.fullmatch(r"(\d+)-[a-z0-9_]{8}", entry.name[len(prefix):]) \
            if entry.name.startswith(prefix) else None
        if m and not _alive(int(m.group(1))) and entry.is_dir() and not entry.is_symlink():
            log.info("removing %s, left by process %s, which has ended", entry, m.group(1))
            shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):   # another user's process; not a pid we wrote
        return True
    return True


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
    old = None
    try:
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
            os.replace(dest, old / dest.name)
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except OSError as e:
        where = ""
        if old is not None and (old / dest.name).exists() and not dest.exists():
            try:                                   # put the old one back where it was
                os.replace(old / dest.name, dest)
                shutil.rmtree(old, ignore_errors=True)
            except OSError:
                where = f"; the previous one is in {old / dest.name}"
        raise NmtError(f"{dest}: cannot install the {what} ({e.strerror or e}){where}"
                       ) from None
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


def write_all(stream: IO[bytes], data: bytes) -> None:
    """Write every byte of ``data`` to ``stream``. A raw stream (sys.stdout.buffer is one under
    ``python -u`` and PYTHONUNBUFFERED=1) may take only part of it and return the count: on a
    nearly full disk, at a file size limit, after a signal; the rest goes in further calls. A
    write that takes nothing means the device takes no more (ENOSPC); a non-blocking
    descriptor that is full is waited on."""
    view = memoryview(data)
    while view:
        try:
            n = stream.write(view)
        except BlockingIOError as e:        # a buffered writer over a non-blocking descriptor
            n, full = e.characters_written, True
        else:
            full = n is None                # a raw stream over a full non-blocking descriptor
        if full:
            _wait_writable(stream)
        elif n == 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n or 0:]


def _wait_writable(stream: IO[bytes]) -> None:
    import select

    select.select([], [stream.fileno()], [])


@contextmanager
def output_errors(name: str, stdout: IO[bytes] | None = None) -> Iterator[None]:
    """A failure to write (full disk, quota, I/O error) inside becomes a one-line NmtError
    ``NAME: cannot write (REASON)``; a closed pipe stays BrokenPipeError (the commands stop
    quietly on it). ``stdout``: the stream is stdout, whose unwritten rest is discarded
    (:func:`discard_stdout`)."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as e:
        if stdout is not None:
            discard_stdout(stdout)
        raise NmtError(f"{name}: cannot write ({e.strerror or e})") from None


class LineWriter:
    """Writes output lines to stdout or a file, UTF-8, '\\n' endings, every byte
    (:func:`write_all`) or an error.

    A failure to write is a one-line NmtError naming the output (``<stdout>`` for stdout),
    wherever it shows: at a write, at a flush or at the flush of :meth:`close` (a redirected
    stdout is buffered, so a full disk often shows only there). A closed pipe stays
    BrokenPipeError. :meth:`over` wraps a stream opened elsewhere (e.g. by atomic_write).
    """

    def __init__(self, path: str | os.PathLike | None):
        self.path = None if path in (None, "-") else Path(path)
        self.name = "<stdout>" if self.path is None else str(self.path)
        self._stdout: IO[bytes] | None = None
        if self.path is None:
            self._f: IO[bytes] = sys.stdout.buffer
            self._stdout = self._f
            self._own = False
            with self._writing():
                sys.stdout.flush()      # text printed before goes first
        else:
            try:
                self._f = open(self.path, "wb")
            except OSError as e:
                raise NmtError(f"{self.path}: cannot write ({e.strerror})") from None
            self._own = True

    @classmethod
    def over(cls, stream: IO[bytes], name: str) -> "LineWriter":
        """A writer of the open binary ``stream`` (not closed by :meth:`close`), named ``name``
        in errors."""
        self = cls.__new__(cls)
        self.path, self.name, self._f, self._own, self._stdout = None, name, stream, False, None
        return self

    def _writing(self):
        return output_errors(self.name, self._stdout)

    def write(self, line: str) -> None:
        self.write_text(line + "\n")

    def write_text(self, text: str) -> None:
        """``text`` as it is (the caller ends its lines)."""
        with self._writing():
            write_all(self._f, text.encode("utf-8"))

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


def print_line(text: str) -> None:
    """``text`` and a line break on stdout, every byte, flushed: the one line (a path) that
    nmt-preprocess, nmt-train and nmt-export print. An error names ``<stdout>``."""
    out = LineWriter(None)
    out.write(text)
    out.flush()


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
