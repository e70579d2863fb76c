"""Word signatures: rare words replaced by a token that keeps their shape.

A parser trained on a few thousand sentences sees most words once or never. Mapped to a single
``<unk>``, "Waertsilae", "2,050-passenger", "35.2" and "averted" all look alike, although their
shape tells much of their category (a capitalized word is usually a proper noun, a number heads
a QP or an NP, ``-ed`` marks a past participle). The signature keeps that shape:

    Waertsilae -> UNK-Cap       35.2 -> UNK-NUM       averted -> UNK-low-ed
    2,050-passenger -> UNK-DIG-low-HYPH-er            Miami-based -> UNK-Cap-HYPH-ed

A word keeps its own form when the training split has it at least ``min_count`` times.
Signatures hold no brackets, so a linearized tree stays a bracket sequence.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Iterable, Sequence

PREFIX = "UNK"
_NUMBER = re.compile(r"[+-]?[\d.,:/\\-]*\d[\d.,:/\\-]*%?")
# Longest first: "ness" before "s", "ing" before "g".
_SUFFIXES = ("ment", "ness", "able", "ible", "tion", "sion", "ing", "ity", "ous", "ive",
             "ism", "ist", "ize", "est", "ed", "ly", "al", "er", "ic", "en", "s", "y")


def signature(word: str, first: bool = False) -> str:
    """The signature of ``word``; ``first``: it opens the sentence (its capital says less)."""
    if _NUMBER.fullmatch(word):
        return f"{PREFIX}-NUM"
    parts = [PREFIX]
    if any(c.isdigit() for c in word):
        parts.append("DIG")
    letters = [c for c in word if c.isalpha()]
    if not letters:
        parts.append("SYM")
    elif len(letters) > 1 and all(c.isupper() for c in letters):
        parts.append("CAPS")
    elif letters[0].isupper():
        parts.append("Init" if first else "Cap")
    else:
        parts.append("low")
    if "-" in word.strip("-"):
        parts.append("HYPH")
    lower = word.lower()
    for suffix in _SUFFIXES:
        stem = lower[:-len(suffix)]
        if lower.endswith(suffix) and len(stem) >= 3 and stem[-1].isalpha():
            parts.append(suffix)
            break
    return "-".join(parts)


class Signatures:
    """Maps the words of a sentence: frequent ones to themselves, rare ones to a signature."""

    def __init__(self, counts: Counter, min_count: int):
        if min_count < 1:
            raise ValueError("min_count must be >= 1")
        self.counts = counts
        self.min_count = min_count

    @classmethod
    def from_sentences(cls, sentences: Iterable[Sequence[str]], min_count: int) -> "Signatures":
        counts: Counter = Counter()
        for words in sentences:
            counts.update(words)
        return cls(counts, min_count)

    def is_rare(self, word: str) -> bool:
        return self.counts[word] < self.min_count

    def map(self, words: Sequence[str]) -> list[str]:
        return [signature(w, first=(i == 0)) if self.is_rare(w) else w
                for i, w in enumerate(words)]
