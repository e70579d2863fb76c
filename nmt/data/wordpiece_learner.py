"""A deterministic wordpiece vocabulary learner.

The vocabulary is learnt as Hugging Face tokenizers' WordPieceTrainer learns it (BPE merges
on whitespace-separated words, continuation units marked ``##``), but with every tie broken
the same way on every run: tokenizers' trainer numbers its symbols in hash-map order, which
also decides between pairs of equal count, so the same command gave a different vocabulary
(and different shards) on each run (huggingface/tokenizers#1794).

- Each distinct word is spelt as its first character and ``##`` + each later character.
- The alphabet (every such unit) comes first, most frequent first, then units in order.
- Then, until the vocabulary holds ``vocab_size`` symbols (specials included), the most
  frequent adjacent pair of units (ties: the smaller pair of strings) is merged everywhere
  into one unit, ``a + b`` without ``b``'s ``##``, and added, unless it is one already;
  a pair seen fewer than ``min_frequency`` times is never merged.

Pair counts are kept up to date incrementally (an index from each pair to the words that
hold it, and a heap with stale entries skipped), so each merge costs the words it touches.
"""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Iterable

CONT = "##"


def learn_wordpiece_vocab(sentences: Iterable[str], vocab_size: int, min_frequency: int,
                          specials: tuple[str, ...]) -> list[str]:
    """The vocabulary, specials first, of at most ``vocab_size`` symbols (more only when the
    alphabet alone is larger: every character must stay spellable)."""
    counts = Counter(w for s in sentences for w in s.split())
    words = sorted(counts)                         # a fixed order for everything below
    freq = [counts[w] for w in words]
    units = [[w[0]] + [CONT + c for c in w[1:]] for w in words]

    alphabet: Counter = Counter()
    for spelt, f in zip(units, freq):
        for u in spelt:
            alphabet[u] += f
    vocab = list(specials)
    seen = set(vocab)
    for u, _ in sorted(alphabet.items(), key=lambda kv: (-kv[1], kv[0])):
        if u not in seen:
            vocab.append(u)
            seen.add(u)

    pairs: Counter = Counter()
    where: dict[tuple[str, str], set[int]] = {}
    for i, spelt in enumerate(units):
        for pair in zip(spelt, spelt[1:]):
            pairs[pair] += freq[i]
            where.setdefault(pair, set()).add(i)
    heap = [(-n, a, b) for (a, b), n in pairs.items()]
    heapq.heapify(heap)

    while len(vocab) < vocab_size and heap:
        n, a, b = heapq.heappop(heap)
        if -n != pairs.get((a, b), 0):             # stale: the count changed since
            continue
        if -n < min_frequency:
            break
        merged = a + b[len(CONT):]
        if merged not in seen:
            vocab.append(merged)
            seen.add(merged)
        changed: set[tuple[str, str]] = set()
        for i in sorted(where.pop((a, b), ())):
            old = units[i]
            new = _merge(old, a, b, merged)
            for pair in zip(old, old[1:]):
                pairs[pair] -= freq[i]
                changed.add(pair)
                holders = where.get(pair)
                if holders is not None:
                    holders.discard(i)
            for pair in zip(new, new[1:]):
                pairs[pair] += freq[i]
                changed.add(pair)
                where.setdefault(pair, set()).add(i)
            units[i] = new
        for pair in changed:                       # (a, b) among them, at count 0 now
            count = pairs.get(pair, 0)
            if count <= 0:
                pairs.pop(pair, None)
                where.pop(pair, None)
            else:
                heapq.heappush(heap, (-count, pair[0], pair[1]))
    return vocab


def _merge(spelt: list[str], a: str, b: str, merged: str) -> list[str]:
    out, i = [], 0
    while i < len(spelt):
        if i + 1 < len(spelt) and spelt[i] == a and spelt[i + 1] == b:
            out.append(merged)
            i += 2
        else:
            out.append(spelt[i])
            i += 1
    return out


__all__ = ["learn_wordpiece_vocab"]
