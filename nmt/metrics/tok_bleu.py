"""The paper's BLEU: Moses-tokenized, hyphenated compounds split, 4-gram BLEU on tokens.

This is how tensor2tensor (``get_ende_bleu.sh``) and fairseq (``compound_split_bleu.sh``)
computed the WMT'14 En-De figures (27.3 base / 28.4 big):

1. tokenize hypotheses and references with the Moses tokenizer (``tokenizer.perl -l LANG``,
   escaping on, no aggressive hyphen splitting; here sacremoses);
2. split compounds: ``sed 's/\\([^ ]\\)-\\([^ ]\\)/\\1 ##AT##-##AT## \\2/g'``. Matches do not
   overlap, exactly as with sed's ``g`` flag: ``a-b-c`` becomes ``a ##AT##-##AT## b-c``
   because the ``b`` was consumed by the first match;
3. corpus BLEU as ``multi-bleu.perl`` computes it: tokens split on whitespace, n-grams up to 4
   clipped by the maximum count in any reference, the closest reference length per sentence
   (the shorter one on ties), no smoothing (a zero precision gives 0), the brevity penalty on
   corpus lengths.

Before step 1, Unicode quotation marks are mapped to ASCII on hypotheses and references alike
(:func:`ascii_quotes`; ``normalize_quotes=False`` turns it off). The paper's En-De number
was computed against a newstest2014 reference whose quotes had been normalized that way
(tensor2tensor issue 317), and a model trained on punctuation-normalized text writes ``"``
where the raw reference has ``„``/``“``: without it every quote is a miss.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

# The recipes' perl -ple 's{(\S)-(\S)}{$1 ##AT##-##AT## $2}g': \S of bytes, so that ASCII
# whitespace (a tab too) is no part of a compound, and everything else is.
_COMPOUND = re.compile(r"([^ \t\n\r\f\v])-([^ \t\n\r\f\v])")
# multi-bleu.perl reads bytes: Perl's split on \s separates at ASCII whitespace only.
_SPLIT = re.compile(r"[ \t\n\r\f\v]+")
MAX_ORDER = 4

# The quotation marks that Moses' normalize-punctuation (sacremoses' MosesPunctNormalizer, which
# the WMT recipes apply to the training text) turns into ASCII, plus their rarer relatives.
# Single quotes become the apostrophe, as MosesPunctNormalizer does: then German ‚...‘, French
# l’homme and English it’s read as the model learnt to write them, and the tokenizer splits
# and escapes them exactly as the ASCII apostrophe, on both sides. The double prime ″ (inches,
# seconds) and the accents ´ ` are not quotation marks and stay.
DOUBLE_QUOTES = "\u201e\u201c\u201d\u201f\u00ab\u00bb\u301d\u301e\uff02"   # „“”‟«»〝〞＂
SINGLE_QUOTES = "\u201a\u2018\u2019\u201b\u2039\u203a"                       # ‚‘’‛‹›
_TO_ASCII = str.maketrans({**{c: '"' for c in DOUBLE_QUOTES}, **{c: "'" for c in SINGLE_QUOTES}})
# Moses-tokenized text (--pretokenized) has the quotes escaped: map every form, ASCII included,
# to tokenizer.perl's escapes so that an unescaped side still matches an escaped one.
_TO_ESCAPED = str.maketrans({**{c: "&quot;" for c in DOUBLE_QUOTES + '"'},
                             **{c: "&apos;" for c in SINGLE_QUOTES + "'"}})
def ascii_quotes(line: str, escaped: bool = False) -> str:
    """Unicode double quotes to ``"``, single quotes to ``'`` (``&quot;``/``&apos;`` when
    ``escaped``, for text that is Moses-tokenized already)."""
    return line.translate(_TO_ESCAPED if escaped else _TO_ASCII)


def split_compounds(line: str) -> str:
    return _COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def moses_tokenize(line: str, lang: str = "en") -> str:
    """``tokenizer.perl -l LANG`` (escaping on, no ``-a``)."""
    from nmt.data import moses  # imported here: nmt-score need not load nmt.data otherwise

    return moses.tokenize(line, lang, escape=True)


def prepare(line: str, lang: str = "en", tokenize: bool = True, compound_split: bool = True,
            normalize_quotes: bool = True) -> str:
    if normalize_quotes:
        # Before tokenizing: the tokenizer then splits and escapes them as ASCII quotes.
        line = ascii_quotes(line, escaped=not tokenize)
    if tokenize:
        line = moses_tokenize(line, lang)
    if compound_split:
        line = split_compounds(line)
    return line


def _tokens(line: str) -> list[str]:
    return [t for t in _SPLIT.split(line) if t]


def _ngrams(tokens: list[str], n: int) -> Counter:
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


@dataclass
class TokBleu:
    score: float                 # 0..100
    precisions: list[float]      # 0..100, n = 1..4
    bp: float
    ratio: float
    hyp_len: int
    ref_len: int
    correct: list[int]
    total: list[int]

    def format(self) -> str:
        """multi-bleu.perl's line after 'BLEU = '."""
        p = "/".join(f"{x:.1f}" for x in self.precisions)
        return (f"{self.score:.2f}, {p} (BP={self.bp:.3f}, ratio={self.ratio:.3f}, "
                f"hyp_len={self.hyp_len}, ref_len={self.ref_len})")


def multi_bleu(hyps: Sequence[str], refs: Sequence[Sequence[str]],
               lowercase: bool = False) -> TokBleu:
    """Corpus BLEU on whitespace tokens. ``refs[k][i]`` is reference k of sentence i."""
    correct = [0] * MAX_ORDER
    total = [0] * MAX_ORDER
    hyp_len = ref_len = 0
    for i, hyp in enumerate(hyps):
        h = _tokens(hyp.lower() if lowercase else hyp)
        ref_max: Counter = Counter()
        closest_diff, closest_len = None, 0
        for ref_set in refs:
            r = _tokens(ref_set[i].lower() if lowercase else ref_set[i])
            diff = abs(len(h) - len(r))
            if closest_diff is None or diff < closest_diff \
                    or (diff == closest_diff and len(r) < closest_len):
                closest_diff, closest_len = diff, len(r)
            for n in range(1, MAX_ORDER + 1):
                for g, c in _ngrams(r, n).items():
                    if c > ref_max[g]:
                        ref_max[g] = c
        hyp_len += len(h)
        ref_len += closest_len
        for n in range(1, MAX_ORDER + 1):
            for g, c in _ngrams(h, n).items():
                total[n - 1] += c
                correct[n - 1] += min(c, ref_max.get(g, 0))
    prec = [c / t if t else 0.0 for c, t in zip(correct, total)]
    if ref_len == 0 or hyp_len == 0:
        # multi-bleu.perl prints 0 (or dies dividing by a zero hypothesis length).
        bp, score = (0.0 if hyp_len == 0 else 1.0), 0.0
    else:
        bp = 1.0 if hyp_len >= ref_len else math.exp(1 - ref_len / hyp_len)
        # log(0) counts as -9999999999 in multi-bleu.perl: the score underflows to 0.
        logs = [math.log(p) if p > 0 else -9999999999.0 for p in prec]
        score = bp * math.exp(sum(logs) / MAX_ORDER)
    return TokBleu(100 * score, [100 * p for p in prec], bp,
                   hyp_len / ref_len if ref_len else 0.0, hyp_len, ref_len, correct, total)


def tok_bleu(hyps: Sequence[str], refs: Sequence[Sequence[str]], lang: str = "en",
             tokenize: bool = True, compound_split: bool = True,
             lowercase: bool = False, normalize_quotes: bool = True) -> TokBleu:
    """ASCII quotes (unless ``normalize_quotes`` is False), tokenize, split compounds, then
    :func:`multi_bleu`."""
    q = normalize_quotes
    h = [prepare(x, lang, tokenize, compound_split, q) for x in hyps]
    r = [[prepare(x, lang, tokenize, compound_split, q) for x in ref] for ref in refs]
    return multi_bleu(h, r, lowercase)


# normalize-punctuation.perl as the Multi30k release ran it (the Moses snapshot 3a0631a its
# repository ships) maps single curly quotes between two ASCII letters to ' (it reads bytes:
# "d’œil" has no ASCII letter after the quote) and every other one to ", where sacremoses
# (as Moses since 2019) keeps them single quotes.
_LETTER_QUOTE = re.compile(r"([A-Za-z])[‘’]([A-Za-z])")
_SINGLE_QUOTES = str.maketrans({"‘": '"', "‚": '"', "’": '"'})


def literature_prepare(line: str, lang: str, lowercase: bool) -> str:
    """One line as the Multi30k literature scores it (the dataset's ``task1-tokenize.sh``):
    ``lowercase.perl`` (when ``lowercase``), ``normalize-punctuation.perl -l LANG`` of the
    Moses snapshot the release used, then ``tokenizer.perl -l LANG`` (escaping on, no
    ``-a``); no compound splitting. The normalizer sees the line with its newline, as the
    Perl script does: its de/fr rule that moves a period after a closing quote needs a
    character after the quote, and at the end of a line that character is the newline."""
    from nmt.data import moses

    if lowercase:
        line = line.lower()
    line = _LETTER_QUOTE.sub(r"\1'\2", line).translate(_SINGLE_QUOTES)
    normalized = moses.punct_normalizer(lang).normalize(line + "\n").rstrip("\n")
    return moses.tokenize(normalized, lang, escape=True)


def literature_bleu(hyps: Sequence[str], refs: Sequence[Sequence[str]], lang: str,
                    lowercase: bool, tokenize: bool = True) -> TokBleu:
    """multi-bleu.perl on hypotheses and references prepared by :func:`literature_prepare`:
    the protocol of the Multi30k papers (e.g. Wu et al. 2021), which score lowercased,
    punctuation-normalized, Moses-tokenized text. ``tokenize=False``: the text is prepared
    already (e.g. the release's ``*.lc.norm.tok.*`` and a model's output on it); only
    lowercased when ``lowercase``, as multi-bleu.perl -lc would (preparing it twice would
    escape its escapes again: ``&quot;`` to ``&amp; quot ;``)."""
    def prep(x: str) -> str:
        if tokenize:
            return literature_prepare(x, lang, lowercase)
        return x.lower() if lowercase else x

    return multi_bleu([prep(x) for x in hyps], [[prep(x) for x in ref] for ref in refs])


def literature_signature(lang: str, lowercase: bool, tokenize: bool = True) -> str:
    import sacremoses

    tok = f"tok:moses-{lang}|norm:moses-punct" if tokenize else "tok:none|norm:none"
    return (f"{tok}|case:{'lc' if lowercase else 'mixed'}|"
            f"smooth:none|version:sacremoses-{getattr(sacremoses, '__version__', '?')}")


def signature(lang: str, tokenize: bool, compound_split: bool, lowercase: bool,
              normalize_quotes: bool = True) -> str:
    import sacremoses

    tok = f"moses-{lang}" if tokenize else "none"
    return (f"tok:{tok}|split:{'compound' if compound_split else 'no'}|"
            f"quotes:{'ascii' if normalize_quotes else 'raw'}|"
            f"case:{'lc' if lowercase else 'mixed'}|smooth:none|"
            f"version:sacremoses-{getattr(sacremoses, '__version__', '?')}")
