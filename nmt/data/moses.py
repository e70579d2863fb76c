"""Moses tokenization (sacremoses): one cached tokenizer, detokenizer and punctuation
normalizer per language, for every user (text codecs, preprocessing workers, tok-BLEU, the
example recipes).

sacremoses is imported on first use only: it loads its data files when imported. Building a
tokenizer compiles its regular expressions, so each is built once per language and process
(a worker process of nmt-preprocess builds its own).
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=None)
def tokenizer(lang: str):
    """The ``sacremoses.MosesTokenizer`` of ``lang`` (``tokenizer.perl -l LANG``)."""
    from sacremoses import MosesTokenizer

    return MosesTokenizer(lang=lang)


@lru_cache(maxsize=None)
def detokenizer(lang: str):
    """The ``sacremoses.MosesDetokenizer`` of ``lang``."""
    from sacremoses import MosesDetokenizer

    return MosesDetokenizer(lang=lang)


@lru_cache(maxsize=None)
def punct_normalizer(lang: str):
    """The ``sacremoses.MosesPunctNormalizer`` of ``lang`` (``normalize-punctuation.perl``)."""
    from sacremoses import MosesPunctNormalizer

    return MosesPunctNormalizer(lang)


def tokenize(line: str, lang: str, escape: bool = False,
             aggressive_dash_splits: bool = False) -> str:
    """Moses tokens of ``line`` joined by spaces, by default without aggressive hyphen splitting
    (no ``-a``). ``escape=False`` (the codecs) keeps '&' and '<' as they are; ``escape=True`` is
    ``tokenizer.perl``'s default (XML entities), what tok-BLEU scores. fairseq's
    ``--tokenizer moses`` escapes and splits hyphens (unless --moses-no-escape /
    --moses-no-dash-splits)."""
    return tokenizer(lang).tokenize(line, escape=escape,
                                    aggressive_dash_splits=aggressive_dash_splits,
                                    return_str=True)


def detokenize(text: str, lang: str, unescape: bool = False) -> str:
    """Undo :func:`tokenize` on whitespace-separated tokens; ``unescape`` turns XML entities
    back into characters (fairseq's detokenizer always does)."""
    return detokenizer(lang).detokenize(text.split(), unescape=unescape)


__all__ = ["tokenizer", "detokenizer", "punct_normalizer", "tokenize", "detokenize"]
