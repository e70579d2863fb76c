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
``p`` > 0 every candidate merge of every step is left out with probability ``p``, and a word
stops merging when no candidate is left, so words come out in smaller pieces of the same
vocabulary.
"""

from __future__ import annotations

import random
from typing import Sequence

WORD_START = "\u2581"


class DropoutBPE:
    """Samples BPE-dropout segmentations with a sentencepiece BPE model's merges."""

    def __init__(self, sp) -> None:
        self.sp = sp
        self.unk = sp.unk_id()
        self.ids: dict[str, int] = {}
        self.scores: dict[str, float] = {}
        for i in range(sp.get_piece_size()):
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
        ids: list[int] = []
        for s in syms:
            i = self.ids.get(s, self.unk)
            if i == self.unk and ids and ids[-1] == self.unk:
                continue           # a run of unknown characters is one <unk>, as in sentencepiece
            ids.append(i)
        return ids
