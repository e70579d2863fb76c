"""BPE-dropout (Provilkov et al. 2020) over a sentencepiece BPE model, reproducible by seed.

sentencepiece samples BPE segmentations itself (``enable_sampling``), but its draws differ from
one process to the next even under ``set_random_generator_seed``, so a preprocessed corpus
could not be rebuilt byte for byte. This module applies the model's merges itself, with
Python's seeded ``random.Random``: the same text, model, p and seed give the same ids in any
process, with any number of workers.

How sentencepiece's BPE encodes a line: normalize it (``SentencePieceProcessor.normalize``:
NFKC, whitespace to U+2581 with a leading one), cut it before each U+2581, start every word
from its characters, and merge again and again the adjacent pair whose concatenation is the
vocabulary piece of highest score (the leftmost of equal ones). With ``p`` = 0 the
:class:`DropoutBPE` below gives exactly sentencepiece's ids (tested on real text); with
``p`` > 0 every candidate merge of every step is left out with probability ``p`` (the paper's
procedure), and a word stops merging when no candidate is left, so words come out in smaller
pieces of the same vocabulary. That costs O(n^2) draws for a word of n characters, so words
longer than :data:`LONG_WORD` characters (URLs, unbroken runs of script without spaces) take
sentencepiece's own variant in O(n log n): candidates wait in a heap and each is left out with
probability ``p`` once, when it comes up. A character outside the vocabulary is ``<unk>`` (a
run of them one ``<unk>``), or its UTF-8 bytes ``<0xNN>`` when the model has byte fallback.
User-defined pieces are not matched as one piece: nmt's trainer makes none.
"""

from __future__ import annotations

import heapq
import random
from typing import Sequence

WORD_START = "\u2581"
LONG_WORD = 64       # characters: longer words merge through a heap (see the module's text)


class DropoutBPE:
    """Samples BPE-dropout segmentations with a sentencepiece BPE model's merges."""

    def __init__(self, sp) -> None:
        self.sp = sp
        self.unk = sp.unk_id()
        self.ids: dict[str, int] = {}
        self.scores: dict[str, float] = {}
        self.byte_ids: dict[int, int] | None = None      # byte value -> id of "<0xNN>"
        for i in range(sp.get_piece_size()):
            if sp.is_byte(i):
                if self.byte_ids is None:
                    self.byte_ids = {}
                self.byte_ids[int(sp.id_to_piece(i)[3:5], 16)] = i
                continue
            if sp.is_unknown(i) or sp.is_control(i) or sp.is_unused(i):
                continue
            piece = sp.id_to_piece(i)
            self.ids[piece] = i
            self.scores[piece] = sp.get_score(i)

    def encode(self, lines: Sequence[str], p: float, seed: int) -> list[list[int]]:
        """Ids of ``lines``, each merge left out with probability ``p``; draws from ``seed``."""
        rng = random.Random(seed)
        return [self.encode_line(line, p, rng) for line in lines]

    def encode_line(self, line: str, p: float, rng: random.Random) -> list[int]:
        text = self.sp.normalize(line)
        out: list[int] = []
        start = 0
        for i in range(1, len(text) + 1):
            if i == len(text) or text[i] == WORD_START:
                if i > start:
                    out.extend(self._word(text[start:i], p, rng))
                start = i
        return out

    def _word(self, word: str, p: float, rng: random.Random) -> list[int]:
        whole = self.ids.get(word)
        if whole is not None and p == 0.0:
            return [whole]
        if len(word) > LONG_WORD:
            return self._ids(_merge_heap(list(word), self.scores, p, rng))
        syms = list(word)
        scores = self.scores
        while len(syms) > 1:
            best_i, best = -1, 0.0
            for i in range(len(syms) - 1):
                score = scores.get(syms[i] + syms[i + 1])
                if score is None or (p and rng.random() < p):
                    continue
                if best_i < 0 or score > best:
                    best_i, best = i, score
            if best_i < 0:
                break
            syms[best_i:best_i + 2] = [syms[best_i] + syms[best_i + 1]]
        return self._ids(syms)

    def _ids(self, syms: list[str]) -> list[int]:
        ids: list[int] = []
        for s in syms:
            i = self.ids.get(s)
            if i is not None:
                ids.append(i)
            elif self.byte_ids is not None:       # byte fallback: the character's UTF-8 bytes
                ids.extend(self.byte_ids[b] for b in s.encode("utf-8"))
            elif not ids or ids[-1] != self.unk:  # a run of unknown characters is one <unk>
                ids.append(self.unk)
        return ids


def _merge_heap(syms: list[str], scores: dict[str, float], p: float,
                rng: random.Random) -> list[str]:
    """BPE merges of one word in O(n log n), as sentencepiece orders them (highest score, then
    leftmost); each candidate that comes up is left out with probability ``p``."""
    n = len(syms)
    right = list(range(1, n)) + [-1]
    left = list(range(-1, n - 1))
    heap: list[tuple[float, int, int, str]] = []

    def push(i: int, j: int) -> None:
        piece = syms[i] + syms[j]
        score = scores.get(piece)
        if score is not None:
            heapq.heappush(heap, (-score, i, j, piece))

    for i in range(n - 1):
        push(i, i + 1)
    alive = [True] * n
    while heap:
        _, i, j, piece = heapq.heappop(heap)
        # stale: a neighbour merged since this pair was pushed
        if not (alive[i] and alive[j] and right[i] == j and syms[i] + syms[j] == piece):
            continue
        if p and rng.random() < p:
            continue
        syms[i], alive[j] = piece, False
        k = right[j]
        right[i] = k
        if k != -1:
            left[k] = i
        if left[i] != -1:
            push(left[i], i)
        if k != -1:
            push(i, k)
    return [s for s, a in zip(syms, alive) if a]
