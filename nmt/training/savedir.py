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
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import torch

from nmt import checkpoint as ckpt_io
from nmt.errors import NmtError

log = logging.getLogger("nmt.train")

_NUMBERED = re.compile(r"^checkpoint_(\d+)\.pt$")
LAST, BEST = "checkpoint_last.pt", "checkpoint_best.pt"


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
        from nmt.io import atomic_write
        with open(src, "rb") as fin, atomic_write(dest, "wb") as fout:
            while chunk := fin.read(1 << 24):
                fout.write(chunk)


class SaveDir:
    """One run's save directory (only rank 0 writes; every rank may read)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def prepare(self) -> None:
        """Create it and check that it is writable: fail now, not at the first save."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise NmtError(f"{self.path}: cannot create save directory ({e.strerror})") from None
        if not os.access(self.path, os.W_OK):
            raise NmtError(f"{self.path}: save directory is not writable")

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

    def write(self, ckpt: Mapping[str, Any], update: int, is_best: bool,
              keep_last: int, keep: Iterable[int] = ()) -> Path:
        """Save checkpoint_<update>.pt, point the last (and best) links at it, and prune
        numbered checkpoints beyond the ``keep_last`` newest, except the updates in ``keep``."""
        path = ckpt_io.save_checkpoint(ckpt, self.path / f"checkpoint_{update}.pt")
        link_or_copy(path, self.last)
        if is_best:
            link_or_copy(path, self.best)
        protected = set(keep)
        for old in self.numbered()[:-max(keep_last, 1)]:
            if checkpoint_update(old) not in protected:
                old.unlink(missing_ok=True)
        return path

    def remove_stale_temporaries(self) -> None:
        """A run killed while saving leaves '.checkpoint_*.tmp' files (never a checkpoint)."""
        for p in self.path.glob(".checkpoint*.tmp"):
            try:
                p.unlink()
                log.info("removed %s, left by an interrupted save", p)
            except OSError:
                pass

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
