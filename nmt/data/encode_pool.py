"""Parallel encoding for nmt-preprocess: a process pool with bounded read-ahead.

Workers rebuild the codecs from their plain ``to_state()`` once (pool initializer), then receive
chunks of raw (undecoded) lines and send back flat id arrays, so the parent only reads, writes
and counts. Results come back in submission order; at most ``2 * workers + 1`` chunks are in
flight, so memory does not depend on the corpus size.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from nmt.data import moses
from nmt.data.codec import TextCodec
from nmt.data.dictionary import UNK
from nmt.data.subword import count_whitespace_tokens
from nmt.io import _decode_line


def decode_all(raw: Sequence[bytes], name: str, first: int) -> list[str]:
    """Strict UTF-8 decoding; an error names the file and the line (``first`` is 1-based)."""
    return [_decode_line(r, name, first + i) for i, r in enumerate(raw)]


# Per-process state: the codecs (built once by the initializer). Moses tokenizers are cached
# per process by nmt.data.moses.
_W: dict[str, Any] = {}


def _worker_init(src_state: dict | None, tgt_state: dict | None, threads_env: bool) -> None:
    # Ctrl-C reaches the whole process group: the parent stops the pool and reports in one
    # line; a worker's KeyboardInterrupt traceback would only bury it. (SIGTERM stays as it
    # is: the pool stops its workers with it.)
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if threads_env:
        # One process per core already: no thread pools inside the tokenizers.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    _W.clear()
    if src_state is not None:
        _W["src"] = TextCodec.from_state(src_state)
        _W["tgt"] = (_W["src"] if tgt_state is None else TextCodec.from_state(tgt_state))


def task_tokenize(raw: list[bytes], name: str, first: int, lang: str) -> list[str]:
    """Decode and Moses-tokenize lines (for the subword learner's sample)."""
    return [moses.tokenize(line, lang) for line in decode_all(raw, name, first)]


def task_count(raw: list[bytes], name: str, first: int, lang: str | None) -> Counter:
    lines = decode_all(raw, name, first)
    if lang is not None:
        lines = [moses.tokenize(x, lang) for x in lines]
    return count_whitespace_tokens(lines)


@dataclass
class Filter:
    apply: bool
    max_len: int
    max_ratio: float


def task_encode(first: int, a: list[bytes], b: list[bytes], src_name: str, tgt_name: str,
                 flt: Filter, dropout: tuple[float, int, int] | None = None) -> tuple:
    """Encode one chunk of pairs; returns the kept pairs' ids and the chunk's counts.

    ``dropout``: (p, seed, copy): BPE-dropout pieces, drawn with a seed of their own for
    each (seed, copy, chunk, side), so that the data does not depend on --workers."""
    src_codec: TextCodec = _W["src"]
    tgt_codec: TextCodec = _W["tgt"]
    s_drop = t_drop = None
    if dropout is not None:
        p, seed, copy = dropout
        s_seed, t_seed = np.random.SeedSequence([seed % 2**64, copy, first]).generate_state(2)
        s_drop, t_drop = (p, int(s_seed)), (p, int(t_seed))
    s_flat, s_len = src_codec.encode_flat(decode_all(a, src_name, first), dropout=s_drop)
    t_flat, t_len = tgt_codec.encode_flat(decode_all(b, tgt_name, first), dropout=t_drop)
    # Each pair is counted under the first rule it breaks: empty, too long, ratio.
    empty = (s_len == 0) | (t_len == 0)
    longest = np.maximum(s_len, t_len)
    too_long = ~empty & (longest > flt.max_len) if flt.max_len else np.zeros_like(empty)
    if flt.max_ratio:
        shortest = np.maximum(np.minimum(s_len, t_len), 1)
        ratio = ~empty & ~too_long & (longest > flt.max_ratio * shortest)
    else:
        ratio = np.zeros_like(empty)
    counts = (int(empty.sum()), int(too_long.sum()), int(ratio.sum()))
    if flt.apply and any(counts):
        keep = ~(empty | too_long | ratio)
        s_flat = s_flat[np.repeat(keep, s_len)]
        t_flat = t_flat[np.repeat(keep, t_len)]
        s_len, t_len = s_len[keep], t_len[keep]
    return (len(a), s_flat, s_len, t_flat, t_len, counts,
            int(np.count_nonzero(s_flat == UNK)), int(np.count_nonzero(t_flat == UNK)))


class Runner:
    """Runs tasks in order on a process pool (or inline for one worker), with bounded
    read-ahead so that memory stays flat however large the input."""

    def __init__(self, workers: int, src: TextCodec | None = None, tgt: TextCodec | None = None):
        self.workers = workers
        self.pool = None
        src_state = src.to_state() if src is not None else None
        tgt_state = (None if tgt is None or tgt is src else tgt.to_state())
        if workers > 1:
            # spawn, not fork: the parent may hold threads (sentencepiece, tokenizers' rayon).
            ctx = mp.get_context("spawn")
            self.pool = ctx.Pool(workers, initializer=_worker_init,
                                 initargs=(src_state, tgt_state, True))
        else:
            _W.clear()
            if src is not None:
                _W["src"], _W["tgt"] = src, (tgt if tgt is not None else src)

    def imap(self, fn, arg_iter) -> Iterator[Any]:
        if self.pool is None:
            for args in arg_iter:
                yield fn(*args)
            return
        pending: deque = deque()
        limit = 2 * self.workers + 1
        for args in arg_iter:
            pending.append(self.pool.apply_async(fn, args))
            while len(pending) >= limit:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


__all__ = ["Runner", "Filter", "decode_all", "task_encode", "task_count", "task_tokenize"]
