"""One writer per directory: an advisory lock held for a whole run.

Two ``nmt-train`` runs into one save directory would resume from each other's checkpoints,
interleave their logs and delete each other's saves in progress; two ``nmt-preprocess`` into one
destination would each print a directory that holds only one of them. So the writer takes an
exclusive ``flock`` on a lock file (inside the directory, or beside a destination that is built
under a temporary name and renamed into place) and keeps it until it exits; a second writer
refuses at once, naming the holder's PID.

The kernel drops a ``flock`` when the process dies, even by kill -9, so a lock file left behind
by a dead process blocks nothing: the next writer takes it over. The holder removes the file on
release; a writer checks after locking that the path still names the file it locked (it may have
locked a file that its holder had just removed), and tries again if not.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import time
from pathlib import Path

from nmt.errors import NmtError

log = logging.getLogger("nmt")

LOCK_NAME = ".nmt.lock"     # inside a directory that one run owns (nmt-train's --save-dir)


class WriterLock:
    """An exclusive lock on ``lock_path`` that guards ``guarded`` (named in messages), taken by
    ``prog`` (e.g. "nmt-train"). Use as a context manager, or :meth:`acquire`/:meth:`release`.

    ``hint`` ends the refusal, e.g. "wait for it to finish, or give another --save-dir"."""

    def __init__(self, lock_path: str | os.PathLike, guarded: str | os.PathLike, prog: str,
                 hint: str = ""):
        self.path, self.guarded, self.prog, self.hint = Path(lock_path), str(guarded), prog, hint
        self._fd: int | None = None

    def acquire(self) -> "WriterLock":
        while self._fd is None:
            fd = self._open()
            if fd is None:
                return self                  # no locking on this filesystem (warned)
            if not _names(self.path, fd):    # its holder removed it as we locked: again
                os.close(fd)
                continue
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()} {self.prog}\n".encode(), 0)
            except OSError:
                pass     # a full disk: the lock holds all the same, a refusal names no PID
            self._fd = fd
        return self

    def _open(self) -> int | None:
        """A descriptor of the lock file with the lock taken; NmtError if another holds it."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise NmtError(f"{self.guarded}: cannot create the lock file {self.path} "
                           f"({e.strerror or e})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                # e.g. a network filesystem without flock: run, but say what is not guarded.
                os.close(fd)
                log.warning("%s: cannot lock %s (%s): nothing stops a second writer",
                            self.guarded, self.path, e.strerror or e)
                return None
            holder = _holder(fd)
            os.close(fd)
            raise NmtError(f"{self.guarded} is in use by another {holder[1] or self.prog} "
                           f"(pid {holder[0] or 'unknown'})"
                           + (f"; {self.hint}" if self.hint else "")) from None
        return fd

    def release(self) -> None:
        """Remove the lock file, then unlock (in this order: see the module's docstring).

        Only while the path still names the file this lock holds: when the guarded directory
        was moved away during the run, the path may now hold another writer's lock file."""
        if self._fd is None:
            return
        try:
            if _names(self.path, self._fd):
                self.path.unlink()
        except OSError:
            pass
        os.close(self._fd)
        self._fd = None

    def __del__(self) -> None:
        # A holder dropped without release() (e.g. a Run built but never run) unlocks too.
        try:
            self.release()
        except Exception:      # noqa: BLE001 - at interpreter exit, modules may be gone
            pass

    def __enter__(self) -> "WriterLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (False when it names none)."""
    try:
        mine, named = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (mine.st_dev, mine.st_ino) == (named.st_dev, named.st_ino)


def _holder(fd: int) -> tuple[str, str]:
    """(pid, program) that the holder wrote into the lock file; it writes them just after
    locking, so a refusal in between waits a moment for them."""
    for _ in range(20):
        text = os.pread(fd, 256, 0).decode("utf-8", "replace").split()
        if text:
            return text[0], " ".join(text[1:])
        time.sleep(0.05)
    return "", ""


def make_directories(path: str | os.PathLike) -> list[Path]:
    """``mkdir -p path``; returns the directories it created, deepest first (what
    :func:`remove_if_empty` may take back when a run fails before writing anything)."""
    p = Path(path)
    created = []
    probe = p
    while not probe.exists() and probe != probe.parent:
        created.append(probe)
        probe = probe.parent
    p.mkdir(parents=True, exist_ok=True)
    return created


def remove_if_empty(created: list[Path]) -> None:
    """Remove the directories of :func:`make_directories` that are still empty, deepest
    first; a directory that something else has written into stays, and so do its parents."""
    for d in created:
        try:
            d.rmdir()
        except OSError:
            return


__all__ = ["WriterLock", "LOCK_NAME", "make_directories", "remove_if_empty"]
