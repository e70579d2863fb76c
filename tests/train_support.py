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


def write_reversal_corpus(directory, run, extra_args=(), valid: bool = True) -> str:
    """Write a tiny word-reversal corpus (train 60 / valid 8 pairs, languages xx -> yy; no valid
    split with ``valid=False``) under ``directory``, binarize it with the real nmt-preprocess
    through ``run`` (a subprocess runner returning CompletedProcess) and return the data
    directory's path."""
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(20)]
    for split, n in (("train", 60), ("valid", 8))[:2 if valid else 1]:
        src = [" ".join(rng.choice(words, size=rng.integers(2, 8))) for _ in range(n)]
        (directory / f"{split}.xx").write_text("\n".join(src) + "\n")
        (directory / f"{split}.yy").write_text(
            "\n".join(" ".join(s.split()[::-1]) for s in src) + "\n")
    valid_args = ["--validpref", str(directory / "valid")] if valid else []
    r = run(["nmt-preprocess", "-s", "xx", "-t", "yy", "--trainpref", str(directory / "train"),
             *valid_args, "--destdir", str(directory / "bin"),
             "--subword", "none", "--joined-dictionary", *extra_args])
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()
