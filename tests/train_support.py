"""Tiny in-memory parallel data with the DataDir interface, for the training tests."""

from __future__ import annotations

import numpy as np

from nmt.data.codec import whitespace_codec
from nmt.data.dictionary import Dictionary

WORDS = [f"w{i}" for i in range(24)]


class FakeSplit:
    def __init__(self, src: list[np.ndarray], tgt: list[np.ndarray]):
        self._src, self._tgt = src, tgt
        self.src_sizes = np.array([len(x) for x in src], dtype=np.int32)
        self.tgt_sizes = np.array([len(y) for y in tgt], dtype=np.int32)

    def __len__(self) -> int:
        return len(self._src)

    def src(self, i: int) -> np.ndarray:
        return self._src[i].astype(np.int64)

    def tgt(self, i: int) -> np.ndarray:
        return self._tgt[i].astype(np.int64)


class FakeData:
    """A reversal task: the target is the source backwards (learnable in a few updates)."""

    src_lang, tgt_lang, joined = "xx", "yy", True

    def __init__(self, n_train: int = 96, n_valid: int = 16, seed: int = 0, max_len: int = 9):
        d = Dictionary(WORDS)
        self.src_codec = self.tgt_codec = whitespace_codec(d)
        rng = np.random.default_rng(seed)
        first = d.nspecial

        def make(n):
            src = [rng.integers(first, len(d), size=int(rng.integers(2, max_len)))
                   for _ in range(n)]
            return FakeSplit(src, [s[::-1].copy() for s in src])

        self._splits = {"train": make(n_train), "valid": make(n_valid)}
        self.splits = list(self._splits)

    def load_split(self, name: str) -> FakeSplit:
        return self._splits[name]
