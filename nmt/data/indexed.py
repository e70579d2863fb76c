"""Memory-mapped token shards: ``{prefix}.bin`` (ids, flat) + ``{prefix}.idx`` (int64 offsets).

Sentence i of a shard is ``bin[idx[i]:idx[i+1]]`` (no eos). ``idx`` has n+1 entries starting
at 0. Nothing is loaded whole: both files are opened with ``numpy.memmap``; only the sentence
lengths (an int32 array, 4 bytes per sentence) are kept in memory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Sequence

import numpy as np

from nmt.errors import NmtError

IDX_DTYPE = np.dtype("<i8")


def shard_prefix(directory: Path, split: str, lang: str, k: int) -> Path:
    return Path(directory) / f"{split}.{lang}.{k}"


# --- writing -----------------------------------------------------------------------------------

class ShardWriter:
    """Streams sentences into one shard; only the running totals stay in memory."""

    def __init__(self, prefix: Path, dtype: np.dtype):
        self.prefix = Path(prefix)
        self.dtype = np.dtype(dtype).newbyteorder("<")
        try:
            self._bin: BinaryIO = open(f"{prefix}.bin", "wb")
            self._idx: BinaryIO = open(f"{prefix}.idx", "wb")
        except OSError as e:
            raise NmtError(f"{prefix}.bin: cannot write ({e.strerror})") from None
        self._idx.write(np.zeros(1, IDX_DTYPE).tobytes())
        self.sentences = 0
        self.tokens = 0

    def add(self, flat: np.ndarray, lens: np.ndarray) -> None:
        """``flat``: the ids of len(lens) sentences, concatenated; ``lens``: their lengths."""
        if len(lens) == 0:
            return
        offsets = self.tokens + np.cumsum(lens, dtype=np.int64)
        try:
            self._bin.write(np.ascontiguousarray(flat, dtype=self.dtype).tobytes())
            self._idx.write(offsets.astype(IDX_DTYPE, copy=False).tobytes())
        except OSError as e:
            raise NmtError(f"{self.prefix}.bin: cannot write ({e.strerror or e})") from None
        self.sentences += len(lens)
        self.tokens = int(offsets[-1])

    def close(self) -> None:
        for f in (self._bin, self._idx):
            if not f.closed:
                try:
                    f.flush()
                    os.fsync(f.fileno())
                    f.close()
                except OSError as e:
                    # A full disk often shows only here (delayed allocation).
                    raise NmtError(f"{f.name}: cannot write ({e.strerror or e})") from None


class SplitWriter:
    """Writes one split of one language as shards of at most ``shard_size`` sentences.

    Source and target writers of a split receive the same sentence counts, so their shard
    boundaries coincide.
    """

    def __init__(self, directory: Path, split: str, lang: str, dtype: np.dtype,
                 shard_size: int = 0):
        self.directory, self.split, self.lang = Path(directory), split, lang
        self.dtype = dtype
        self.shard_size = shard_size if shard_size and shard_size > 0 else None
        self.shard_sizes: list[int] = []
        self.tokens = 0
        self._cur = self._open(0)

    def _open(self, k: int) -> ShardWriter:
        return ShardWriter(shard_prefix(self.directory, self.split, self.lang, k), self.dtype)

    def add(self, flat: np.ndarray, lens: np.ndarray) -> None:
        start_tok = 0
        start = 0
        n = len(lens)
        while start < n:
            room = n - start if self.shard_size is None else self.shard_size - self._cur.sentences
            if room == 0:
                self._roll()
                continue
            stop = min(n, start + room)
            ntok = int(lens[start:stop].sum())
            self._cur.add(flat[start_tok:start_tok + ntok], lens[start:stop])
            start_tok += ntok
            start = stop

    def _roll(self) -> None:
        self._cur.close()
        self.shard_sizes.append(self._cur.sentences)
        self.tokens += self._cur.tokens
        self._cur = self._open(len(self.shard_sizes))

    def close(self) -> list[int]:
        """Close the last shard; returns the number of sentences in each shard."""
        self._cur.close()
        self.shard_sizes.append(self._cur.sentences)
        self.tokens += self._cur.tokens
        return self.shard_sizes


# --- reading -----------------------------------------------------------------------------------

class IndexedShard:
    """One memory-mapped shard; with ``vocab_size``, every id is checked to be below it."""

    def __init__(self, prefix: Path, dtype: np.dtype, vocab_size: int | None = None):
        self.prefix = Path(prefix)
        dtype = np.dtype(dtype).newbyteorder("<")
        idx_path, bin_path = Path(f"{prefix}.idx"), Path(f"{prefix}.bin")
        for p in (idx_path, bin_path):
            if not p.is_file():
                raise NmtError(f"{p}: no such file (incomplete data directory?)")
        idx_bytes, bin_bytes = idx_path.stat().st_size, bin_path.stat().st_size
        if idx_bytes < IDX_DTYPE.itemsize or idx_bytes % IDX_DTYPE.itemsize \
                or bin_bytes % dtype.itemsize:
            raise NmtError(f"{prefix}: corrupt shard (file sizes do not match the format)")
        self.idx = np.memmap(idx_path, dtype=IDX_DTYPE, mode="r")
        # numpy cannot map an empty file; an empty shard (e.g. all-empty sentences) is legal.
        self.bin = (np.memmap(bin_path, dtype=dtype, mode="r") if bin_bytes
                    else np.zeros(0, dtype=dtype))
        if self.idx[0] != 0 or self.idx[-1] != len(self.bin):
            raise NmtError(f"{prefix}: corrupt shard (index does not match the token file)")
        sizes = np.diff(self.idx)
        if len(sizes) and sizes.min() < 0:
            raise NmtError(f"{prefix}: corrupt shard (offsets decrease)")
        self.sizes = sizes.astype(np.int32)
        if vocab_size is not None:
            self._check_ids(bin_path, vocab_size)

    def _check_ids(self, bin_path: Path, vocab_size: int) -> None:
        """An id outside the vocabulary would fail deep inside an embedding lookup; one pass
        over the mapped file (sequential reads) finds it when the shard is opened."""
        if not len(self.bin):
            return
        high = int(self.bin.max())
        low = 0 if self.bin.dtype.kind == "u" else int(self.bin.min())   # uint16: no sign
        if low < 0 or high >= vocab_size:
            bad = low if low < 0 else high
            raise NmtError(f"{bin_path}: token id {bad} is outside the vocabulary of "
                           f"{vocab_size} symbols (corrupt shard, or a dictionary from "
                           f"another data directory)")

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> np.ndarray:
        return np.asarray(self.bin[self.idx[i]:self.idx[i + 1]], dtype=np.int64)


class IndexedDataset:
    """The shards of one split and language, seen as one sequence of sentences."""

    def __init__(self, prefixes: Sequence[Path], dtype: np.dtype, vocab_size: int | None = None):
        self.shards = [IndexedShard(p, dtype, vocab_size) for p in prefixes]
        counts = np.array([len(s) for s in self.shards], dtype=np.int64)
        # starts[k] = global index of shard k's first sentence
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        self.sizes = (np.concatenate([s.sizes for s in self.shards]) if self.shards
                      else np.zeros(0, np.int32))

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int) -> np.ndarray:
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"sentence {i} out of range (0..{len(self) - 1})")
        if len(self.shards) == 1:
            return self.shards[0][i]
        k = int(np.searchsorted(self._starts, i, side="right")) - 1
        return self.shards[k][i - int(self._starts[k])]


class ParallelDataset:
    """Aligned source and target sentences of one split (memory-mapped).

    ``src_sizes``/``tgt_sizes``: int32 lengths without eos; ``src(i)``/``tgt(i)``: int64 ids
    without eos (fresh arrays, safe to hand to ``torch.from_numpy``).
    """

    def __init__(self, src: IndexedDataset, tgt: IndexedDataset, name: str = ""):
        if len(src) != len(tgt):
            raise NmtError(f"split {name or '?'}: {len(src)} source but {len(tgt)} target "
                           f"sentences (corrupt data directory)")
        self.name = name
        self._src, self._tgt = src, tgt
        self.src_sizes: np.ndarray = src.sizes
        self.tgt_sizes: np.ndarray = tgt.sizes

    def __len__(self) -> int:
        return len(self.src_sizes)

    def __repr__(self) -> str:
        return f"ParallelDataset({self.name!r}, {len(self)} pairs)"

    def src(self, i: int) -> np.ndarray:
        return self._src[i]

    def tgt(self, i: int) -> np.ndarray:
        return self._tgt[i]

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self._src[i], self._tgt[i]


__all__ = ["ShardWriter", "SplitWriter", "IndexedShard", "IndexedDataset", "ParallelDataset",
           "shard_prefix"]
