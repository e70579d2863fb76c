"""The symbol table: ids <-> symbols, with the four specials of docs/DESIGN.md at ids 0-3.

Saved fairseq style (``dict.{lang}.txt``): one ``symbol count`` line per non-special symbol, in id
order, so id = line number + 4 (0-based).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np

from nmt.errors import NmtError
from nmt.io import iter_lines, write_text_atomic

from nmt.specials import BOS, EOS, PAD, SPECIALS, UNK  # noqa: F401 (re-exported)


class Dictionary:
    """Maps symbols to dense ids. Specials first: <pad>=0, <s>=1, </s>=2, <unk>=3.

    Both fairseq spellings work: ``d.pad_index`` (attribute) and ``d.pad()`` (method).
    """

    pad_index, bos_index, eos_index, unk_index = PAD, BOS, EOS, UNK
    pad_word, bos_word, eos_word, unk_word = SPECIALS

    def __init__(self, symbols: Sequence[str] = (), counts: Sequence[int] | None = None):
        """``symbols``: the non-special symbols in id order (ids 4, 5, ...)."""
        self.symbols: list[str] = list(SPECIALS)
        self.counts: list[int] = [0] * len(SPECIALS)
        self._index: dict[str, int] = {s: i for i, s in enumerate(SPECIALS)}
        counts = list(counts) if counts is not None else [0] * len(symbols)
        if len(counts) != len(symbols):
            raise ValueError("symbols and counts differ in length")
        for s, c in zip(symbols, counts):
            self.add_symbol(s, int(c))

    # --- fairseq-style accessors --------------------------------------------------------------
    def pad(self) -> int:
        return PAD

    def bos(self) -> int:
        return BOS

    def eos(self) -> int:
        return EOS

    def unk(self) -> int:
        return UNK

    @property
    def nspecial(self) -> int:
        return len(SPECIALS)

    # --- mapping ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.symbols)

    def __getitem__(self, idx: int) -> str:
        return self.symbols[idx] if 0 <= idx < len(self.symbols) else self.unk_word

    def __contains__(self, sym: str) -> bool:
        return sym in self._index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Dictionary) and self.symbols == other.symbols

    def __repr__(self) -> str:
        return f"Dictionary({len(self)} symbols)"

    def index(self, sym: str) -> int:
        return self._index.get(sym, UNK)

    def add_symbol(self, sym: str, count: int = 0) -> int:
        if sym in self._index:
            i = self._index[sym]
            self.counts[i] += count
            return i
        if not sym or "\n" in sym or "\r" in sym:
            # Such a symbol could not be saved as one "symbol count" line. Other whitespace is
            # fine: the count is split off at the last space.
            raise NmtError(f"invalid dictionary symbol {sym!r}: empty or contains a line break")
        i = len(self.symbols)
        self.symbols.append(sym)
        self.counts.append(count)
        self._index[sym] = i
        return i

    def encode_tokens(self, tokens: Iterable[str]) -> list[int]:
        get = self._index.get
        return [get(t, UNK) for t in tokens]

    def string(self, ids: Iterable[int], keep_unk: bool = True) -> list[str]:
        """Symbols of ``ids`` up to the first eos, without pad/bos (and unk unless keep_unk)."""
        out = []
        n = len(self.symbols)
        for i in ids:
            i = int(i)
            if i == EOS:
                break
            if i in (PAD, BOS) or (i == UNK and not keep_unk):
                continue
            out.append(self.symbols[i] if 0 <= i < n else self.unk_word)
        return out

    @property
    def dtype(self) -> np.dtype:
        """The compact id dtype used on disk: uint16 when every id fits, else int32."""
        return np.dtype(np.uint16) if len(self) <= 65536 else np.dtype(np.int32)

    def set_counts(self, counts: np.ndarray) -> None:
        """Replace the counts (e.g. with corpus frequencies measured while binarizing)."""
        if len(counts) != len(self.symbols):
            raise ValueError("counts do not match the dictionary size")
        self.counts = [int(c) for c in counts]

    # --- construction -----------------------------------------------------------------------
    @classmethod
    def from_counts(cls, counts: Mapping[str, int] | Counter, vocab_size: int | None = None,
                    threshold: int = 1) -> "Dictionary":
        """Most frequent first (ties broken by symbol for determinism); ``vocab_size`` counts the
        specials; symbols seen fewer than ``threshold`` times are dropped."""
        items = [(s, c) for s, c in counts.items() if c >= threshold and s not in SPECIALS]
        items.sort(key=lambda sc: (-sc[1], sc[0]))
        if vocab_size is not None:
            items = items[:max(0, vocab_size - len(SPECIALS))]
        return cls([s for s, _ in items], [c for _, c in items])

    # --- persistence ------------------------------------------------------------------------
    def to_state(self) -> dict:
        return {"symbols": self.symbols[len(SPECIALS):], "counts": self.counts[len(SPECIALS):]}

    @classmethod
    def from_state(cls, state: Mapping) -> "Dictionary":
        return cls(state["symbols"], state.get("counts"))

    def save(self, path: str | os.PathLike) -> None:
        lines = [f"{s} {c}\n" for s, c in zip(self.symbols[len(SPECIALS):],
                                                 self.counts[len(SPECIALS):])]
        write_text_atomic(path, "".join(lines))

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Dictionary":
        """Read a ``symbol count`` file (fairseq's dict.txt format; specials are implicit)."""
        p = Path(path)
        d = cls()
        for lineno, line in enumerate(iter_lines(p), 1):
            sym, _, count = line.rpartition(" ")
            if not sym or not (count.isascii() and count.isdigit()):
                # The line is not shown: the file may not be a dictionary at all (a crafted
                # meta.json or --srcdict naming some other file), and its content is not ours
                # to print.
                raise NmtError(f"{p}: line {lineno}: not a dictionary line (expected 'symbol "
                               f"count', a symbol, a space and a number)")
            if sym in SPECIALS:
                continue
            if sym in d:
                raise NmtError(f"{p}: line {lineno}: duplicate symbol {sym[:40]!r}")
            d.add_symbol(sym, int(count))
        return d
