"""What a resumable nmt-generate run has done, kept so that a rerun can check it: the lines
of its partial output and a hash of the input it has consumed (nmt.batch.resumable).

A journal's counts are trusted by nothing else: a rerun reads the partial output's first
``output_bytes`` and the input's first ``input_bytes`` again and compares their line counts
and the input's sha256 with the journal's, so that a tampered or stale journal (lines skipped
or repeated, an input edited in place with its size and time restored) is refused instead
of giving a wrong file with exit 0; and the finished file must hold exactly the lines its
input asks for.
"""

from __future__ import annotations

import hashlib
import os

from nmt.errors import NmtError

BLOCK = 1 << 20


def _blocks(path: str | os.PathLike, start: int, end: int):
    """The bytes [start, end) of ``path``, block by block; NmtError if it is shorter."""
    with open(path, "rb") as f:
        f.seek(start)
        left = end - start
        while left > 0:
            data = f.read(min(BLOCK, left))
            if not data:
                raise NmtError(f"{path}: shorter than the progress journal says")
            left -= len(data)
            yield data


def newlines(path: str | os.PathLike, start: int, end: int) -> int:
    """Newlines in the bytes [start, end) of ``path``."""
    return sum(data.count(b"\n") for data in _blocks(path, start, end))


def count_lines(path: str | os.PathLike, end: int) -> tuple[int, bool]:
    """(newlines in the first ``end`` bytes of ``path``, whether they end with one)."""
    n, last = 0, b"\n"
    for data in _blocks(path, 0, end):
        n += data.count(b"\n")
        last = data[-1:]
    return n, last == b"\n"


class InputTally:
    """The sha256 and line count of an input's consumed bytes, extended chunk by chunk."""

    def __init__(self, path: str | os.PathLike):
        self.path = path
        self.bytes = self.newlines = 0
        self.last = b"\n"
        self._hash = hashlib.sha256()

    def extend(self, end: int) -> None:
        """Take in the input's bytes up to ``end``."""
        for data in _blocks(self.path, self.bytes, end):
            self._hash.update(data)
            self.newlines += data.count(b"\n")
            self.last = data[-1:]
        self.bytes = max(self.bytes, end)

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    def lines(self) -> int:
        """Input lines in the bytes taken in (a last line without its newline counts)."""
        return self.newlines + (self.last != b"\n")


def check_resume(state: dict, partial, input_path, per_line: int | None) -> InputTally:
    """NmtError unless the journal ``state`` agrees with the partial output and the input; the
    input's tally up to the journal's position. ``per_line``: output lines per input line
    (None: the output holds only some input lines, a torchrun rank's share)."""
    where = f"{os.path.basename(partial)} and its journal"
    newlines, whole = count_lines(partial, state["output_bytes"])
    if newlines != state["output_lines"] or not whole:
        raise NmtError(f"{where} disagree ({newlines} output lines, the journal says "
                       f"{state['output_lines']}): add --overwrite to start afresh")
    if per_line is not None and state["output_lines"] != state["input_lines"] * per_line:
        raise NmtError(f"{where}: {state['output_lines']} output lines for "
                       f"{state['input_lines']} input lines: add --overwrite to start afresh")
    tally = InputTally(input_path)
    tally.extend(state["input_bytes"])
    ends_input = state["input_bytes"] == os.path.getsize(input_path)
    if tally.newlines != state["input_lines"] and not (
            ends_input and tally.lines() == state["input_lines"]):
        raise NmtError(f"{input_path}: its first {state['input_bytes']} bytes hold "
                       f"{tally.newlines} lines, the progress journal says "
                       f"{state['input_lines']}: add --overwrite to start afresh")
    if tally.sha256 != state["input_sha256"]:
        raise NmtError(f"{input_path}: the lines already translated have changed since (their "
                       f"sha256 differs from the progress journal's): add --overwrite to "
                       f"start afresh")
    return tally


__all__ = ["InputTally", "check_resume", "count_lines", "newlines"]
