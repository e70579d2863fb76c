"""--replace-unk: each output word holding ``<unk>`` becomes the source word it is aligned to,
as fairseq-generate's --replace-unk does (without a dictionary: the word is copied as it is,
which suits names and numbers, the usual unknown words).

The link is the alignment of nmt.search.forced.align (the encoder-decoder attention of one
decoder layer, averaged over heads and models) from the first ``<unk>`` subword of the target
word to a source subword, whose whole word is copied in its surface form (the source line's
own word, so characters the vocabulary lacks come through). A hypothesis without ``<unk>``
keeps its text byte for byte.
"""

from __future__ import annotations

from typing import Sequence

from nmt.search.forced import align, word_indices
from nmt.specials import EOS, UNK


def replace_unknowns(translator, results, sources: Sequence[Sequence[int]],
                     layer: int | None = None) -> None:
    """Rewrite, in place, the text of every hypothesis of ``results`` (nmt.search.translator
    Translation objects) that holds ``<unk>``; ``sources[i]``: the source ids result i was
    translated from (as the model read them, truncation included); ``layer``: the
    alignment's decoder layer."""
    todo = [(r, h, list(sources[i])) for i, r in enumerate(results) for h in r.hypotheses
            if UNK in h.ids]
    if not todo:
        return
    src_codec, tgt_codec = translator.src_codec, translator.tgt_codec
    src_ids = [s for _, _, s in todo]
    tgt_ids = [[i for i in h.ids if i != EOS] for _, h, _ in todo]
    links = align(translator, src_ids, tgt_ids, layer)
    for (r, h, _), s, t, a in zip(todo, src_ids, tgt_ids, links):
        h.text = replaced_text(src_codec, tgt_codec, r.source, s, t, a)


def replaced_text(src_codec, tgt_codec, source: str, src_ids: Sequence[int],
                  tgt_ids: Sequence[int], links: Sequence[int]) -> str:
    """The detokenized target ``tgt_ids`` (no eos) with each word that holds ``<unk>``
    replaced by the source word its first ``<unk>`` links to (``links``: one source subword
    position or -1 per target subword); unlinked words keep their subwords."""
    words = source_words(src_codec, source, src_ids)
    src_word = word_indices([src_codec.dictionary[i] for i in src_ids], src_codec.kind)
    tgt_word = word_indices([tgt_codec.dictionary[i] for i in tgt_ids], tgt_codec.kind)
    out: list[str] = []
    start = 0
    for end in range(1, len(tgt_ids) + 1):
        if end < len(tgt_ids) and tgt_word[end] == tgt_word[start]:
            continue
        span = range(start, end)
        unk = next((j for j in span if tgt_ids[j] == UNK and links[j] >= 0), None)
        if unk is not None:
            out.append(words[src_word[links[unk]]])
        else:
            out.append(tgt_codec.subword.decode_ids([tgt_ids[j] for j in span]))
        start = end
    return tgt_codec.detokenize(" ".join(w for w in out if w))


def source_words(codec, source: str, src_ids: Sequence[int]) -> list[str]:
    """The source's words in surface form, one per word of ``src_ids``: the (Moses-tokenized)
    line's whitespace tokens when they are as many, else each word's subwords decoded."""
    groups = word_indices([codec.dictionary[i] for i in src_ids], codec.kind)
    n = groups[-1] + 1 if groups else 0
    tokens = codec.tokenize(source).split()
    if len(tokens) == n:
        return tokens
    words: list[list[int]] = [[] for _ in range(n)]
    for i, w in zip(src_ids, groups):
        words[w].append(i)
    return [codec.subword.decode_ids(w) for w in words]


__all__ = ["replace_unknowns", "replaced_text", "source_words"]
