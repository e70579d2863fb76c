"""nmt-generate under torchrun: each rank translates its share of an --input file, and rank 0
merges the shares into --output FILE, byte-identical to a one-process run.

``torchrun --nproc-per-node 8 [--nnodes N ...] --max-restarts 3 --no-python nmt-generate
CKPT -i INPUT --output FILE``: torchrun starts the ranks and restarts them; nmt has no
scheduler of its own and needs no process group. The input is cut into the chunks of one
process (--buffer-size lines, nmt.batch.input); rank r of W translates the chunks i
with i mod W = r, exactly as one process translates them (same lines, same batches, same line
numbers for sampling seeds), into its shard, a resumable output of its own
(nmt.batch.resumable) beside FILE:

- ``FILE.shard-R-of-W.nmt-partial``: the translations of rank R's chunks, in input order,
- ``FILE.shard-R-of-W.nmt-progress.json``: its journal (the run's identity with the share
  "rank R of W", how far the rank got), marked ``"complete"`` when the share is done.

A rank that dies is restarted by torchrun (which restarts every rank of the group): each
resumes its shard after its last complete chunk, and a rank whose shard is complete exits at
once, before loading a model. Rank 0, its own share done, waits for every shard's journal to
say "complete" (all files: FILE must be on a file system every node shares), then writes FILE
(a temporary renamed into place) by taking each chunk's lines from its shard in turn, and
removes the shards. A rerun after that translates afresh, as a finished one-process run does.
A rerun with another world size is refused in one line (the chunks of a shard belong to its
world size); --overwrite starts afresh, on torchrun's first attempt only: a restarted rank
resumes whatever the command line says.

One job writes FILE at a time: rank 0 holds ``.FILE.nmt-lock`` to the end (as a one-process
run does), and each rank ``.FILE.shard-R-of-W.nmt-lock`` while it runs, so a second job or a
one-process run on FILE is refused. Not covered: a rank that has finished its share and
exited while its rank 0 still waits or merges; a second job's rank of that number is not
refused (its rank 0 is).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Iterator

from nmt.batch.config import GenerateConfig
from nmt.batch.resumable import JOURNAL, PARTIAL, ResumableOutput
from nmt.errors import NmtError, UsageError

log = logging.getLogger("nmt.generate")

POLL_S = 0.25            # how often rank 0 looks at the other shards' journals
REPORT_S = 600.0         # how often it says whom it is waiting for


@dataclass(frozen=True)
class Shard:
    """This rank's share: the chunks i (of ``chunk_lines`` lines) with i mod world = rank."""
    rank: int
    world: int
    local_rank: int
    chunk_lines: int

    def owns(self, first_line: int) -> bool:
        """Whether the chunk starting at input line ``first_line`` is this rank's."""
        return (first_line - 1) // self.chunk_lines % self.world == self.rank

    def lines(self, n: int) -> int:
        """How many of the first ``n`` input lines are in this rank's chunks."""
        return sum(min(self.chunk_lines, n - i * self.chunk_lines)
                   for i in range(self.rank, -(-n // self.chunk_lines), self.world))

    def numbered(self, chunks, first: int) -> Iterator[tuple[int, list, int | None]]:
        """(first line, chunk, offset past it) for this rank's chunks among ``chunks``, which
        start at input line ``first``."""
        for chunk, offset in chunks:
            if self.owns(first):
                yield first, chunk, offset
            first += len(chunk)

    def device(self, device: str) -> str:
        """--device for this rank: cuda (or auto on a GPU machine) means cuda:LOCAL_RANK, as
        for nmt-train's ranks."""
        from nmt.runtime import DistInfo, pick_device

        return str(pick_device(device, DistInfo(self.rank, self.world, self.local_rank)))


def torchrun_shard(cfg: GenerateConfig, workers: int) -> Shard | None:
    """This rank's Shard when torchrun started more than one (WORLD_SIZE > 1), else None;
    a one-line UsageError for what cannot be sharded."""
    from nmt.io import is_regular_file
    from nmt.runtime import env_dist_info

    info = env_dist_info()
    if info.world_size <= 1:
        return None
    under = f"under torchrun (WORLD_SIZE={info.world_size})"
    if cfg.split is not None or cfg.score_reference:
        raise UsageError(f"{under} nmt-generate translates an --input file, not a --split "
                         f"or --score-reference")
    if workers > 1:
        raise UsageError("--workers and torchrun exclude each other: each rank is one "
                         "decoding process (ask torchrun for more with --nproc-per-node)")
    if cfg.output_path in (None, "-"):
        raise UsageError(f"{under} nmt-generate needs --output FILE: each rank writes its "
                         f"share beside it and rank 0 merges them")
    if cfg.input_path in (None, "-") or not is_regular_file(cfg.input_path):
        raise UsageError(f"{under} nmt-generate needs --input FILE, a regular file: stdin "
                         f"or a pipe cannot be shared by the ranks")
    shard = Shard(info.rank, info.world_size, info.local_rank, cfg.buffer_size)
    _prefix_logs(f"rank {shard.rank}: ")
    return shard


def _prefix_logs(prefix: str) -> None:
    def add_prefix(record: logging.LogRecord) -> bool:
        record.msg = prefix + str(record.msg)
        return True

    for handler in logging.getLogger("nmt").handlers:
        handler.addFilter(add_prefix)


@contextmanager
def rank_named(shard: Shard | None) -> Iterator[None]:
    """Errors (and interruptions) say which rank they come from."""
    try:
        yield
    except (NmtError, KeyboardInterrupt) as e:
        if shard is not None and str(e):
            e.args = (f"rank {shard.rank}: {e}",)
        raise


def first_attempt() -> bool:
    """Whether this is torchrun's first start of the ranks (not a restart after a failure)."""
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") in ("", "0")


def attempt() -> str:
    """What torchrun's current start of the ranks shares, and no other start (restarts and
    other jobs included); empty for ranks started by hand."""
    return "/".join(os.environ.get(k, "") for k in ("TORCHELASTIC_RUN_ID",
                                                     "TORCHELASTIC_RESTART_COUNT",
                                                     "MASTER_ADDR", "MASTER_PORT"))


def shard_path(output: str | os.PathLike, rank: int, world: int) -> Path:
    output = Path(output)
    return output.with_name(f"{output.name}.shard-{rank}-of-{world}")


class ShardOutput(ResumableOutput):
    """A rank's resumable shard of --output FILE. ``complete``: the journal says the share is
    done (a restart or a rerun: nothing to translate). On a clean exit the journal is marked
    complete and the shard stays in its .nmt-partial file for rank 0 to merge.

    A complete journal also names the torchrun attempt that last saw it complete (attempt()):
    rank 0 merges, then deletes the shards, only when every rank of its own attempt has said
    so, so that it never deletes a shard that a rank just restarted has yet to find complete
    (that rank would translate its share again, for nothing)."""

    def __init__(self, output: str | os.PathLike, identity: dict, shard: Shard,
                 overwrite: bool, lock=None):
        self.output, self.shard, self.complete = Path(output), shard, False
        self.attempt: str | None = None
        super().__init__(shard_path(output, shard.rank, shard.world),
                         {**identity, "shard": [shard.rank, shard.world]}, overwrite, lock)

    def _resume_from(self, state: dict) -> None:
        try:
            size = self.partial.stat().st_size
        except OSError:
            size = -1
        if state.get("complete") is True and size == state["output_bytes"]:
            self.complete = True
            self.lines_done, self.input_bytes = state["input_lines"], state["input_bytes"]
            self.output_bytes, self.attempt = state["output_bytes"], state.get("attempt")
            log.info("%s is complete: nothing to translate", self.path.name)
            return
        super()._resume_from(state)

    def _install(self) -> None:
        try:
            with open(self.partial, "rb+") as f:
                os.fsync(f.fileno())
        except OSError as e:
            raise NmtError(f"{self.partial}: cannot write ({e.strerror or e})") from None
        self.complete = True
        self.acknowledge()

    def acknowledge(self) -> None:
        """Mark the journal complete, seen by this attempt (see the class's docstring)."""
        if self.attempt != attempt():
            self._save_journal(self.lines_done, self.input_bytes, self.output_bytes,
                               complete=True, attempt=attempt())
            self.attempt = attempt()

    def stopped(self) -> str:
        if not self.journal.exists():
            return f"{self.path.name} not written"
        return (f"its share of {self.output} is done up to input line {self.lines_done}; "
                f"rerun the same command to resume")


# --- what earlier runs left -------------------------------------------------------------------

def leftovers(output: Path) -> dict[int, list[Path]]:
    """Journals and partial files of earlier runs writing ``output``, by world size (1: a
    one-process run's)."""
    found: dict[int, list[Path]] = {}
    pattern = re.compile(re.escape(output.name) + r"(?:\.shard-\d+-of-(\d+))?"
                         + f"({re.escape(JOURNAL)}|{re.escape(PARTIAL)})")
    try:
        names = [p.name for p in output.parent.iterdir()]
    except OSError:
        return found
    for name in names:
        m = pattern.fullmatch(name)
        if m:
            found.setdefault(int(m.group(1) or 1), []).append(output.parent / name)
    return found


def check_other_runs(output: str | os.PathLike, world: int, overwrite: bool,
                     remove: bool) -> None:
    """Refuse to start when an interrupted run with another world size (a one-process run
    counting as 1) left its journals beside ``output``; with ``overwrite``, delete them if
    ``remove`` (rank 0 or the one process: one deleter, no race)."""
    output = Path(output)
    others = {w: files for w, files in leftovers(output).items() if w != world}
    if overwrite:
        if remove:
            for files in others.values():
                for p in sorted(files, key=lambda p: not p.name.endswith(JOURNAL)):
                    p.unlink(missing_ok=True)       # journals first: then nothing resumes
        return
    for w, files in sorted(others.items()):
        if not any(p.name.endswith(JOURNAL) for p in files):
            continue                                # no journal: nothing to resume
        was = "without torchrun" if w == 1 else f"under torchrun with WORLD_SIZE={w}"
        now = "1 (no torchrun)" if world == 1 else f"{world}"
        left = (f"{output.name}{JOURNAL}" if w == 1
                else f"{output.name}.shard-*-of-{w}{JOURNAL}")
        raise NmtError(f"{output}: an interrupted run {was} left {left} here (the world "
                       f"size is now {now}): rerun it {was} to resume it, or add --overwrite "
                       f"to start afresh")


# --- rank 0: wait for the shards, merge them --------------------------------------------------

def _shard_state(out: ShardOutput, rank: int) -> tuple[dict | None, tuple]:
    """Rank ``rank``'s journal if it says its share of this run is complete (None if not),
    and what changes when that rank makes progress (for the liveness check)."""
    path = shard_path(out.output, rank, out.shard.world)
    journal = path.with_name(path.name + JOURNAL)
    try:
        st = journal.stat()
    except OSError:
        return None, ()
    sign = (st.st_mtime_ns, st.st_size)
    try:
        state = json.loads(journal.read_text(encoding="utf-8"))
        size = path.with_name(path.name + PARTIAL).stat().st_size
    except (OSError, ValueError):       # being replaced, or not yet there
        return None, sign
    ours = {k: v for k, v in out.identity.items() if k != "shard"}
    same = isinstance(state, dict) and isinstance(state.get("identity"), dict) and \
        {k: v for k, v in state["identity"].items() if k != "shard"} == ours
    done = same and state.get("complete") is True and size == state.get("output_bytes") \
        and state.get("attempt") == attempt()
    return (state if done else None), sign


def wait_for_shards(out: ShardOutput, timeout_min: float) -> dict[int, dict]:
    """Rank 0: every shard's complete journal, once all are. A shard that has not moved for
    ``timeout_min`` minutes (its rank hangs, or died without torchrun noticing) is an error;
    torchrun itself stops this rank when another one fails."""
    start = last_report = time.monotonic()
    pending = {r: (start, ()) for r in range(out.shard.world) if r != out.shard.rank}
    states = {out.shard.rank: {"input_lines": out.lines_done}}
    if pending:
        log.info("waiting for the shares of rank(s) %s", ", ".join(map(str, pending)))
    while pending:
        now = time.monotonic()
        for r, (since, sign) in list(pending.items()):
            state, new_sign = _shard_state(out, r)
            if state is not None:
                states[r] = state
                del pending[r]
            elif new_sign != sign:
                pending[r] = (now, new_sign)
            elif now - since > timeout_min * 60:
                why = ("it hangs, or died without torchrun noticing" if sign else
                       "is --output on a file system that every rank shares?")
                raise NmtError(f"rank {r}'s shard has not moved in {timeout_min:g} min "
                               f"(--shard-timeout; {why}); the shards stay: rerun the same "
                               f"command to resume")
        if pending and now - last_report > REPORT_S:
            log.info("still waiting for rank(s) %s", ", ".join(map(str, pending)))
            last_report = now
        if pending:
            time.sleep(POLL_S)
    return states


def merge_shards(out: ShardOutput, states: dict[int, dict], cfg: GenerateConfig) -> int:
    """Write --output FILE from the shards, each chunk's lines from its shard in turn (a
    temporary renamed into place), then remove the shards; the input's line count."""
    from nmt.batch.modes import lines_per_result
    from nmt.io import atomic_write, fsync_dir, mark_written, write_all

    world, size = out.shard.world, out.shard.chunk_lines
    per_line = lines_per_result(cfg.output_format, cfg.nbest)
    total = max(s["input_lines"] for s in states.values())
    paths = [shard_path(out.output, r, world) for r in range(world)]
    partials = [p.with_name(p.name + PARTIAL) for p in paths]
    files = [open(p, "rb") for p in partials]
    try:
        with atomic_write(out.output, "wb") as f:
            for i in range(-(-total // size)):
                n = min(size, total - i * size) * per_line
                lines = list(islice(files[i % world], n))
                if len(lines) != n or not lines[-1].endswith(b"\n"):
                    raise NmtError(f"{partials[i % world]}: fewer lines than its journal "
                                   f"says; add --overwrite to start afresh")
                write_all(f, b"".join(lines))
            longer = [p for p, fh in zip(partials, files) if fh.read(1)]
            if longer:
                raise NmtError(f"{longer[0]}: more lines than its journal says; add "
                               f"--overwrite to start afresh")
    finally:
        for fh in files:
            fh.close()
    mark_written(out.output, {k: v for k, v in out.identity.items() if k != "shard"})
    for p in paths:                     # journals first: a kill here leaves nothing resumable
        p.with_name(p.name + JOURNAL).unlink(missing_ok=True)
    for p in partials:
        p.unlink(missing_ok=True)
    fsync_dir(out.output.parent)
    return total


def finish(out: ShardOutput, cfg: GenerateConfig, timeout_min: float) -> None:
    """After this rank's share: rank 0 waits for the others and merges; the others are done."""
    out.acknowledge()
    if out.shard.rank != 0:
        log.info("share done; rank 0 merges the shards into %s", out.output)
        return
    states = wait_for_shards(out, timeout_min)
    total = merge_shards(out, states, cfg)
    log.info("merged %d shards into %s (%d input lines)", out.shard.world, out.output, total)


__all__ = ["Shard", "ShardOutput", "torchrun_shard", "rank_named", "first_attempt",
           "attempt", "check_other_runs", "shard_path", "wait_for_shards", "merge_shards",
           "finish"]
