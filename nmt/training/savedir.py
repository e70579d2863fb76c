"""The save directory of a run: numbered checkpoints, the last/best links, pruning, leftovers
of interrupted saves, and finding the newest intact checkpoint to resume from.

    checkpoint_<update>.pt   every save (the newest --keep-last are kept, and the best ones
                             that --average-best needs)
    checkpoint_last.pt       the newest save (a hard link, or a copy where links fail)
    checkpoint_best.pt       the save with the best validation score
    checkpoint_avg_*.pt      averages written at the end of a run
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import torch

from nmt import checkpoint as ckpt_io
from nmt.errors import NmtError
from nmt.io import atomic_write, write_text_atomic

log = logging.getLogger("nmt.train")

_NUMBERED = re.compile(r"^checkpoint_(\d+)\.pt$")
LAST, BEST = "checkpoint_last.pt", "checkpoint_best.pt"
# What a run writes into its save directory (moved aside as a whole by --no-resume).
RUN_FILES = ("checkpoint*.pt", "ensemble_best*.txt", "train_log.jsonl", "curves.png")


def numbered_checkpoints(directory: str | os.PathLike) -> list[Path]:
    """checkpoint_<update>.pt files of ``directory``, oldest (smallest update) first."""
    d = Path(directory)
    found = []
    for p in d.glob("checkpoint_*.pt") if d.is_dir() else []:
        m = _NUMBERED.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def checkpoint_update(path: Path) -> int:
    m = _NUMBERED.match(Path(path).name)
    return int(m.group(1)) if m else -1


def link_or_copy(src: Path, dest: Path) -> None:
    """Make ``dest`` the same file as ``src`` atomically (hard link, else copy)."""
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        if tmp.exists():
            tmp.unlink()
        os.link(src, tmp)
        os.replace(tmp, dest)
    except OSError:
        try:
            with open(src, "rb") as fin, atomic_write(dest, "wb") as fout:
                while chunk := fin.read(1 << 24):
                    fout.write(chunk)
        except OSError as e:
            raise NmtError(f"{dest}: cannot link or copy {src.name} ({e.strerror or e})"
                           ) from None


class SaveDir:
    """One run's save directory (only rank 0 writes; every rank may read)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._lock = None
        self._created: list[Path] = []     # directories that prepare() made
        self._identity: tuple[int, int] | None = None   # (st_dev, st_ino) that prepare() locked
        self.moved_to: Path | None = None    # where move_previous_run() put the old files

    def prepare(self) -> None:
        """Create it, check that it is writable (fail now, not at the first save) and lock it
        for this process until :meth:`release` (one writer per directory: nmt.lock)."""
        from nmt.lock import LOCK_NAME, WriterLock, make_directories

        try:
            self._created = make_directories(self.path)
        except OSError as e:
            raise NmtError(f"{self.path}: cannot create save directory ({e.strerror})") from None
        try:
            if not os.access(self.path, os.W_OK):
                raise NmtError(f"{self.path}: save directory is not writable")
            self._lock = WriterLock(self.path / LOCK_NAME, self.path, "nmt-train",
                                    "wait for it to finish, or give another --save-dir")
            self._lock.acquire()
            st = os.stat(self.path)
            self._identity = (st.st_dev, st.st_ino)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Unlock; remove the directory (and the parents that :meth:`prepare` created) when
        it is still empty: a run that failed before its first save leaves nothing behind."""
        from nmt.lock import remove_if_empty

        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()
        remove_if_empty(self._created)
        self._created = []

    @property
    def last(self) -> Path:
        return self.path / LAST

    @property
    def best(self) -> Path:
        return self.path / BEST

    def numbered(self) -> list[Path]:
        return numbered_checkpoints(self.path)

    def has_checkpoints(self) -> bool:
        return self.last.exists() or bool(self.numbered())

    def intact_message(self) -> str:
        """What a rerun of the same command resumes from."""
        saved = self.numbered()
        if not saved:
            return "no checkpoint was saved yet: the same command starts afresh"
        return (f"{saved[-1]} is intact (checkpoints are written atomically): the same "
                f"command resumes from it")

    def write(self, ckpt: Mapping[str, Any], update: int, is_best: bool,
              keep_last: int, keep: Iterable[int] = (), numbered: bool = True) -> Path:
        """Save checkpoint_<update>.pt, point the last (and best) links at it, and prune
        numbered checkpoints beyond the ``keep_last`` newest, except the updates in ``keep``.
        ``numbered`` False: only checkpoint_last.pt, a point to resume from (a signal's stop
        off the schedule), which pruning and averaging never count."""
        if not numbered:
            self.check_unmoved(f"{LAST} was not written")
            return ckpt_io.save_checkpoint(ckpt, self.last)
        lost = f"checkpoint_{update}.pt was not written"
        self.check_unmoved(lost)
        try:
            path = ckpt_io.save_checkpoint(ckpt, self.path / f"checkpoint_{update}.pt")
            link_or_copy(path, self.last)
            if is_best:
                link_or_copy(path, self.best)
        except (NmtError, OSError):
            self.check_unmoved(lost)          # moved during the save: say that, not ENOENT
            raise
        self.check_unmoved(f"checkpoint_{update}.pt was saved, but nothing was pruned")
        protected = set(keep)
        pruned = False
        for old in self.numbered()[:-max(keep_last, 1)]:
            if checkpoint_update(old) not in protected:
                old.unlink(missing_ok=True)
                pruned = True
        if pruned:
            self._drop_stale_listings()
        return path

    def _drop_stale_listings(self) -> None:
        """Remove an ensemble_best<N>.txt that names a checkpoint no longer here (pruned by a
        run resumed without --ensemble-best): a listing is true or absent."""
        for listing in self.path.glob("ensemble_best*.txt"):
            try:
                names = listing.read_text(encoding="utf-8").split("\n")
            except OSError:
                continue
            if any(n and not Path(n).exists() for n in names):
                listing.unlink(missing_ok=True)
                log.info("removed %s: a checkpoint it named was pruned", listing.name)

    def relink(self, path: Path, best: bool) -> None:
        """Point the last (and, when ``best``, the best) link at ``path``."""
        link_or_copy(path, self.last)
        if best:
            link_or_copy(path, self.best)
        log.info("%s%s now name %s, the newest intact checkpoint", self.last.name,
                 f" and {self.best.name}" if best else "", path.name)

    def unmoved(self) -> bool:
        """Whether the path still names the directory that :meth:`prepare` locked (always
        True where prepare() did not run: ranks other than 0 write nothing)."""
        if self._identity is None:
            return True
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._identity

    @property
    def current(self) -> Path | None:
        """The path while it names the directory this run locked, else None."""
        return self.path if self.unmoved() else None

    def check_unmoved(self, consequence: str) -> None:
        """NmtError unless :meth:`unmoved`; ``consequence`` says what did not happen.

        A save directory moved, removed or replaced during the run must not be recreated at
        the old path (a directory without the run's lock, log or earlier checkpoints, where a
        second run could start and mix with this one), nor written into when another run's
        directory is there now: the write fails with one line instead."""
        if not self.unmoved():
            raise NmtError(f"{self.path}: the save directory was moved, removed or replaced "
                           f"while this run was training; {consequence} (this run's "
                           f"checkpoints are in the directory it locked, wherever it is now)")

    def remove_stale_temporaries(self) -> None:
        """A run killed while saving leaves '.checkpoint_*.tmp' files (never a checkpoint).

        Only the holder of the directory's lock (:meth:`prepare`) calls this, so no live
        writer can be saving here: a temporary file is always a dead run's leftover, never a
        save in progress (two runs in one directory are refused before they get this far)."""
        for p in self.path.glob(".checkpoint*.tmp"):
            try:
                p.unlink()
                log.info("removed %s, left by an interrupted save", p)
            except OSError:
                pass

    def move_previous_run(self) -> Path | None:
        """--no-resume: move the files of the run in this directory (checkpoints, logs, curves,
        ensemble listings) into previous-<date>-<time>/ so that a later resume cannot pick up
        the old run's checkpoints; nothing is deleted. Returns that directory, or None when
        there was nothing to move."""
        old = sorted(p for pattern in RUN_FILES for p in self.path.glob(pattern) if p.is_file())
        if not old:
            return None
        stamp = time.strftime("%Y%m%d-%H%M%S")
        dest, n = self.path / f"previous-{stamp}", 1
        while dest.exists():
            n += 1
            dest = self.path / f"previous-{stamp}-{n}"
        try:
            dest.mkdir()
            for p in old:
                os.replace(p, dest / p.name)
            # the moved listings name the moved checkpoints (not the new run's at the old paths)
            here = str(self.path.resolve())
            for listing in dest.glob("ensemble_best*.txt"):
                lines = listing.read_text(encoding="utf-8").splitlines()
                write_text_atomic(listing, "".join(str(dest.resolve() / Path(x).name) + "\n"
                                                   if str(Path(x).parent) == here else x + "\n"
                                                   for x in lines))
        except (OSError, NmtError) as e:
            why = e.strerror or e if isinstance(e, OSError) else e
            raise NmtError(f"{self.path}: cannot move the previous run's files into {dest} "
                           f"({why})") from None
        self.moved_to = dest
        return dest

    def moved_path(self, path: Path) -> Path:
        """Where ``path`` is now: in the previous run's folder if it was one of the files
        :meth:`move_previous_run` moved there, else ``path``."""
        moved = self.moved_to
        if moved is not None and path.resolve().parent == self.path.resolve() \
                and (moved / path.name).exists() and not path.exists():
            return moved / path.name
        return path

    def newest_intact(self, device: torch.device | str = "cpu",
                      warn: Callable[[str], None] = log.warning) -> tuple[Path, dict] | None:
        """checkpoint_last.pt or a newer checkpoint_<update>.pt, newest first; unreadable files
        (truncated, corrupt, refused) are skipped with a warning. None if nothing exists."""
        numbered = self.numbered()[::-1]
        if not self.last.exists() and not numbered:
            return None
        skipped: list[str] = []

        def attempt(path: Path) -> dict | None:
            try:
                return ckpt_io.load_checkpoint(path, map_location=device)
            except NmtError as e:
                warn(f"skipping an unusable checkpoint: {e}")
                skipped.append(path.name)
                return None

        found: tuple[Path, dict] | None = None
        if self.last.exists():
            ck = attempt(self.last)
            if ck is not None:
                found = (self.last, ck)
        # checkpoint_last.pt is normally a hard link to the newest numbered file (one load);
        # a crash between writing checkpoint_<n>.pt and linking leaves a newer numbered one.
        have = found[1].get("progress", {}).get("update", -1) if found else -1
        for path in numbered:
            if checkpoint_update(path) <= have:
                break
            ck = attempt(path)
            if ck is not None:
                found = (path, ck)
                break
        if found is None:
            raise NmtError(f"{self.path}: no intact checkpoint to resume from "
                           f"({', '.join(skipped)} unreadable); use --no-resume to start afresh "
                           f"or another --save-dir")
        return found


__all__ = ["SaveDir", "numbered_checkpoints", "checkpoint_update", "link_or_copy", "LAST",
           "BEST"]
