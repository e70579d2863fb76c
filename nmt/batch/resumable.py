"""nmt-generate --output FILE -i INPUT is resumable: a rerun of the same command after a kill
-9, a SIGTERM, a reboot or a full disk continues after the last complete chunk of lines, and
the finished FILE is byte-identical to an uninterrupted run's.

Beside FILE, while it is being written:

- ``FILE.nmt-partial``: the output so far; each chunk's lines are written, then fsynced,
- ``FILE.nmt-progress.json``: the journal, replaced atomically after that fsync: what the run
  is (its identity: each checkpoint's and the input's path, size and modification time, and
  every option that changes the output) and how far it got (input lines and bytes, output
  bytes). Bytes of the partial file past the journal's count (a chunk cut by the kill) are
  cut off at the rerun.

The input is translated in chunks that start at the same lines whatever the start
(nmt.batch.input), and sampling seeds each line by its number, so the lines after a
resume are those an uninterrupted run writes. At the end FILE.nmt-partial is renamed to FILE
and the journal removed. A rerun whose identity differs is refused with one line naming the
difference; --overwrite starts afresh. stdin cannot be resumed (it cannot be read again).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Sequence

from nmt.batch.config import GenerateConfig
from nmt.batch.modes import lines_per_result
from nmt.batch.tally import InputTally, check_resume, newlines
from nmt.errors import NmtError
from nmt.io import (LineWriter, atomic_write, check_readable, file_record, fsync_dir,
                    mark_written)
from nmt.lock import WriterLock
from nmt.fields import flag_name

log = logging.getLogger("nmt.generate")

JOURNAL = ".nmt-progress.json"
PARTIAL = ".nmt-partial"
VERSION = 2     # 2: output_lines and input_sha256 (nmt.batch.tally)
# Options that say where the input and output are (recorded as files), not what is written.
_NOT_IDENTITY = ("input_path", "output_path")


def _file_identity(path: str | os.PathLike, what: str) -> dict:
    check_readable(path, what, expected=f"a {what} file")
    return file_record(path)


def run_identity(checkpoints: Sequence[str], cfg: GenerateConfig, device: str,
                 precision: str) -> dict:
    """What makes two runs write the same bytes: the checkpoints, the input, the options."""
    options = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in _NOT_IDENTITY}
    options.update(device=str(device), precision=precision)
    return json.loads(json.dumps({
        "checkpoints": [_file_identity(p, "checkpoint") for p in checkpoints],
        "input": _file_identity(cfg.input_path, "input"), "options": options}))


def _flag(key: str) -> str:
    fields = {f.name: f for f in dataclasses.fields(GenerateConfig)}
    return flag_name(fields[key]) if key in fields else "--" + key.replace("_", "-")


def _files(ids: list[dict]) -> str:
    return ", ".join(i["path"] for i in ids)


def _option_change(flag: str, was, now) -> str:
    """``--beam 1 (now 2)``, ``--beam unset (now 2)``, ``no --sampling (now --sampling)``."""
    if isinstance(was, bool) or isinstance(now, bool):
        return f"{flag if was else 'no ' + flag} (now {flag if now else 'no ' + flag})"
    return f"{flag} {'unset' if was is None else was} (now {'unset' if now is None else now})"


def _share(shard) -> str:
    """A torchrun rank's share in words: ``[1, 4]`` -> "rank 1 of 4"."""
    return f"rank {shard[0]} of {shard[1]}" if isinstance(shard, list) and len(shard) == 2 \
        else "of one process"


def _chunked(options: dict) -> bool:
    """Whether a run's output depends on its chunks (--buffer-size): sampling's random
    stream follows them, and int8's activation scales are per batch; beam search's output
    does not."""
    return bool(options.get("sampling")) or options.get("precision") == "int8"


def difference(old: dict, new: dict) -> str | None:
    """The first thing that differs between two identities, in words; None if none does."""
    if old.get("shard") != new.get("shard"):          # nmt.batch.shards
        return f"share {_share(old.get('shard'))} (now {_share(new.get('shard'))})"
    o, n = old.get("options", {}), new["options"]
    for key in sorted(set(o) | set(n)):
        if key == "buffer_size" and not (_chunked(o) or _chunked(n)):
            continue
        if o.get(key) != n.get(key):
            return _option_change(_flag(key), o.get(key), n.get(key))
    for what in ("checkpoints", "input"):
        was, now = old.get(what), new[what]
        was_l, now_l = (was, now) if what == "checkpoints" else ([was], [now])
        if not isinstance(was_l, list) or [w.get("path") for w in was_l if w] != \
                [x["path"] for x in now_l]:
            name = "checkpoint" if what == "checkpoints" else "input"
            shown = _files(was_l) if isinstance(was_l, list) and all(was_l) else "?"
            return f"{name} {shown} (now {_files(now_l)})"
        for w, x in zip(was_l, now_l):
            if w != x:
                return (f"{x['path']} as it was then (it has changed since: another size or "
                        f"modification time)")
    return None


def output_lock(path: str | os.PathLike) -> WriterLock:
    """The lock, taken, that makes this process the only writer of ``path`` (and of its
    journal and partial file): ``.FILE.nmt-lock`` beside it, removed when released."""
    p = Path(path)
    return WriterLock(p.with_name(f".{p.name}.nmt-lock"), p, "nmt-generate",
                      "wait for it to finish, or give another --output").acquire()


class ResumableOutput:
    """The output FILE of a resumable run: ``with ResumableOutput(...) as out``, write a
    chunk's lines with ``out.writer``, then ``out.commit(lines, input_bytes)``; the rename
    to FILE happens on a clean exit. ``start_line``/``start_byte``: where the input resumes."""

    shard = None        # a torchrun rank's share (nmt.batch.shards.ShardOutput)
    installed = False                   # FILE is in place, whole

    def __init__(self, path: str | os.PathLike, identity: dict, overwrite: bool = False,
                 lock: contextlib.AbstractContextManager | None = None):
        # the output_lock()s its maker took: a context manager that releases them
        self.lock = lock if lock is not None else contextlib.nullcontext()
        self.path = Path(path)
        self.journal = self.path.with_name(self.path.name + JOURNAL)
        self.partial = self.path.with_name(self.path.name + PARTIAL)
        self.identity = identity
        self.lines_done = self.input_bytes = self.output_bytes = self.output_lines = 0
        self.input_path = identity["input"]["path"]
        opts = identity["options"]
        # output lines per input line; None for a torchrun rank's share (some lines only)
        self.per_line = (None if self.shard is not None
                         else lines_per_result(opts["output_format"], opts["nbest"]))
        self.tally = InputTally(self.input_path)
        state = None if overwrite else self._read_journal()
        if state is not None:
            why = difference(state.get("identity", {}), identity)
            if why is not None:
                raise NmtError(f"{self.path}: an interrupted run with {why} left "
                               f"{self.journal.name} here: rerun that command to resume it, "
                               f"or add --overwrite to start afresh")
            self._resume_from(state)

    @property
    def start_line(self) -> int:
        return self.lines_done + 1

    @property
    def start_byte(self) -> int:
        return self.input_bytes

    def _read_journal(self) -> dict | None:
        try:
            text = self.journal.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as e:
            raise NmtError(f"{self.journal}: cannot read ({e.strerror})") from None
        try:
            state = json.loads(text)
            ok = state.get("version") == VERSION and all(
                isinstance(state.get(k), int) and not isinstance(state[k], bool)
                and state[k] >= 0
                for k in ("input_lines", "input_bytes", "output_bytes", "output_lines")
            ) and isinstance(state.get("input_sha256"), str) and isinstance(
                state.get("identity"), dict) and isinstance(
                state["identity"].get("options", {}), dict)
        except (ValueError, AttributeError):
            ok = False
        if not ok:
            raise NmtError(f"{self.journal}: not a progress journal of this nmt-generate; "
                           f"add --overwrite to start afresh")
        return state

    def _resume_from(self, state: dict) -> None:
        try:
            size = self.partial.stat().st_size
        except OSError:
            size = -1
        if size < state["output_bytes"]:
            log.warning("%s: %s is missing or shorter than its journal says; starting afresh",
                        self.path, self.partial.name)
            return
        self.tally = check_resume(state, self.partial, self.input_path, self.per_line)
        self.lines_done, self.input_bytes = state["input_lines"], state["input_bytes"]
        self.output_bytes, self.output_lines = state["output_bytes"], state["output_lines"]
        log.info("resuming %s after input line %d (%d bytes of output kept)", self.path,
                 self.lines_done, self.output_bytes)

    def __enter__(self) -> "ResumableOutput":
        # A kill during a journal update leaves atomic_write's temporary beside it: the
        # journal itself is whole (the old one or the new one), the temporary is garbage.
        for stale in self.journal.parent.glob(f".{self.journal.name}.*.tmp"):
            stale.unlink(missing_ok=True)
        try:
            if self.lines_done:
                self._f = open(self.partial, "r+b")
                self._f.truncate(self.output_bytes)      # a chunk cut by the kill
                self._f.seek(self.output_bytes)
            else:
                # A journal left here describes another run's partial output, which this
                # one is about to replace: it must not survive to be resumed.
                self.journal.unlink(missing_ok=True)
                self._f = open(self.partial, "wb")
        except OSError as e:
            raise NmtError(f"{self.partial}: cannot write ({e.strerror})") from None
        self.writer = LineWriter.over(self._f, str(self.path))
        return self

    def commit(self, lines_done: int, input_bytes: int) -> None:
        """The lines written so far are the translations of the first ``lines_done`` input
        lines, which end at ``input_bytes``: make them durable, then record it."""
        self.writer.flush()
        try:
            os.fsync(self._f.fileno())
            output_bytes = self._f.tell()
        except OSError as e:
            raise NmtError(f"{self.path}: cannot write ({e.strerror})") from None
        self.output_lines += newlines(self.partial, self.output_bytes, output_bytes)
        self.tally.extend(input_bytes)
        self._save_journal(lines_done, input_bytes, output_bytes)
        self.lines_done, self.input_bytes, self.output_bytes = (lines_done, input_bytes,
                                                                output_bytes)

    def _save_journal(self, lines_done: int, input_bytes: int, output_bytes: int,
                      **extra) -> None:
        state = {"version": VERSION, "identity": self.identity, "input_lines": lines_done,
                 "input_bytes": input_bytes, "output_bytes": output_bytes,
                 "output_lines": self.output_lines, "input_sha256": self.tally.sha256, **extra}
        with atomic_write(self.journal, "w") as f:
            f.write(json.dumps(state, indent=1) + "\n")

    def _check_whole(self) -> None:
        """The finished output (one process) is one result per input line, or NmtError."""
        size = os.path.getsize(self.input_path)
        if self.tally.bytes != size:
            why = f"{self.tally.bytes} of the input's {size} bytes translated"
        elif self.lines_done != self.tally.lines():
            why = f"{self.lines_done} lines translated, the input has {self.tally.lines()}"
        elif self.output_lines != self.lines_done * self.per_line:
            why = f"{self.output_lines} output lines for {self.lines_done} input lines"
        else:
            return
        raise NmtError(f"{self.path}: not written: {why}; add --overwrite to start afresh")

    def stopped(self) -> str:
        """What an interrupted run leaves, for its last message."""
        if self.installed:
            return f"{self.path} was written in full"
        if not self.journal.exists():
            return f"{self.path} not written"
        return (f"{self.path}: the first {self.lines_done} lines are done; rerun the same "
                f"command to resume")

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self._f.close()
        except OSError:
            pass        # a failed flush: the journal still says what is complete
        if exc_type is None:
            self._install()
        elif not self.journal.exists():
            self.partial.unlink(missing_ok=True)        # nothing to resume: leave nothing
        elif isinstance(exc, NmtError):
            raise NmtError(f"{exc}; {self.stopped()}") from None

    def _install(self) -> None:
        from nmt.signals import signals_deferred

        self._check_whole()
        try:
            with open(self.partial, "rb+") as f:
                os.fsync(f.fileno())
            # A signal here takes effect once FILE is in place and the journal gone, so
            # that what the stop reports (stopped()) is what is on disk.
            with signals_deferred():
                os.replace(self.partial, self.path)
                self.installed = True
                fsync_dir(self.path.parent)
                self.journal.unlink(missing_ok=True)
                mark_written(self.path, self.identity)
        except OSError as e:
            raise NmtError(f"{self.path}: cannot write ({e.strerror or e})") from None


__all__ = ["ResumableOutput", "output_lock", "run_identity", "difference"]
