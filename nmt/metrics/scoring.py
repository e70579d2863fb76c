"""One entry point for every metric ``nmt-score`` offers: corpus scores and sentence scores.

* ``bleu``, ``chrf``, ``ter``: sacreBLEU's own classes (``BLEU``/``CHRF``/``TER``), built with
  the options its command line would use, so the numbers, the signatures and the text line are
  the ones ``sacrebleu REF -i HYP -m ...`` prints. Lines are right-stripped, as its CLI does.
* ``tok-bleu``: the paper's tokenized, compound-split BLEU (nmt.metrics.tok_bleu).
* ``multi-bleu``: the Multi30k literature's BLEU: (lowercased with ``--lowercase``,)
  punctuation-normalized, Moses-tokenized text scored by multi-bleu.perl's rules.
* ``bracket-f1``: EVALB's labelled bracket F1 (nmt.metrics.evalb), one tree per line.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

from nmt.errors import NmtError, UsageError, suggest
import nmt.metrics.evalb as evalb_mod
import nmt.metrics.tok_bleu as tok_bleu_mod
from nmt.metrics.table import SCORE_METRICS as METRICS
from nmt.version import __version__

SACRE = {"bleu": "BLEU", "chrf": "CHRF", "ter": "TER"}
log = logging.getLogger("nmt.metrics")


@dataclass
class ScoreOptions:
    tokenize: str | None = None        # sacreBLEU BLEU tokenizer (None: its default, 13a)
    lowercase: bool = False            # BLEU and tok-BLEU case-insensitive
    force: bool = False                # sacreBLEU: do not warn about tokenized input
    lang: str | None = None            # target language (Moses tokenizer; sacreBLEU trg_lang)
    chrf_word_order: int = 0           # 2 gives chrF++
    width: int = 1                     # decimals in sacreBLEU's text line (its -w)
    pretokenized: bool = False         # tok-bleu, multi-bleu: input already Moses-tokenized
    normalize_quotes: bool = True      # tok-bleu: Unicode quotes to ASCII on both sides
    evalb: evalb_mod.EvalbParams = field(default_factory=evalb_mod.EvalbParams.collins)
    evalb_name: str = "COLLINS"
    retag: bool = True                 # bracket-f1: gold POS tags replace XX
    names: tuple[str, str] = ("reference", "hypotheses")   # files, named in bracket-f1 errors


@dataclass
class MetricScore:
    metric: str          # the option name, e.g. "bleu"
    name: str            # the display name, e.g. "BLEU", "chrF2"
    score: float
    signature: str
    text: str            # the human line
    details: dict[str, Any]

    rounded: float | None = None   # the score as the reference tool prints it

    def to_json(self) -> dict[str, Any]:
        """'score' is what sacreBLEU / multi-bleu.perl / EVALB print; 'score_exact' is unrounded."""
        d = {"name": self.name,
             "score": self.rounded if self.rounded is not None else float(f"{self.score:.2f}"),
             "score_exact": self.score, "signature": self.signature}
        d.update(self.details)
        return d


def parse_metrics(values: Sequence[str]) -> list[str]:
    """'bleu,chrf' and repeated options -> ['bleu', 'chrf'] (order kept, duplicates dropped)."""
    out: list[str] = []
    for v in values:
        for m in v.split(","):
            m = m.strip().lower()
            if not m:
                continue
            if m not in METRICS:
                raise UsageError(f"unknown metric {m!r}{suggest(m, METRICS)}; "
                                 f"choose from {', '.join(METRICS)}")
            if m not in out:
                out.append(m)
    return out or ["bleu"]


def _sacre_metric(metric: str, opts: ScoreOptions, refs: Sequence[Sequence[str]] | None,
                  sentence: bool):
    from sacrebleu.metrics import BLEU, CHRF, TER

    try:
        if metric == "bleu":
            # sacreBLEU's CLI turns effective order on for sentence-level BLEU.
            return BLEU(lowercase=opts.lowercase, force=opts.force, tokenize=opts.tokenize,
                        trg_lang=opts.lang or "", effective_order=sentence, references=refs)
        if metric == "chrf":
            return CHRF(word_order=opts.chrf_word_order, lowercase=opts.lowercase,
                        references=refs)
        return TER(references=refs)
    except (ImportError, RuntimeError, ValueError, OSError) as e:
        # e.g. a tokenizer whose optional package (mecab, sentencepiece model) is missing
        from urllib.error import URLError

        if isinstance(e, URLError):
            raise NmtError(_download_failed(opts.tokenize, e)) from None
        raise NmtError(f"sacreBLEU {metric}: {type(e).__name__}: {e}") from None


def _download_failed(tokenize: str | None, e) -> str:
    """The error of a sacreBLEU tokenizer (spm, flores101, flores200) whose model sacreBLEU
    downloads on first use, when the download failed (offline, a proxy)."""
    from sacrebleu.utils import SACREBLEU_DIR

    reason = getattr(e, "reason", e)
    reason = getattr(reason, "strerror", None) or reason
    return (f"--tokenize {tokenize}: sacreBLEU needs to download its model for this tokenizer "
            f"into {SACREBLEU_DIR}/models (the SACREBLEU environment variable moves it) and "
            f"could not ({' '.join(str(reason).split())}); run it once with network access, "
            f"or copy the model there")


def _strip(lines: Sequence[str]) -> list[str]:
    return [ln.rstrip() for ln in lines]


def corpus_score(metric: str, hyps: Sequence[str], refs: Sequence[Sequence[str]],
                 opts: ScoreOptions | None = None) -> MetricScore:
    """Score a corpus; ``refs[k]`` is the k-th reference stream (same length as ``hyps``)."""
    opts = opts or ScoreOptions()
    _check(metric, hyps, refs)
    if metric in SACRE:
        refs_s = [_strip(r) for r in refs]
        m = _sacre_metric(metric, opts, refs_s, sentence=False)
        s = m.corpus_score(_strip(hyps), None)
        sig = m.get_signature().format()
        details = json.loads(s.format(opts.width, False, m.get_signature().format(False), True))
        details.pop("name", None)
        details.pop("signature", None)
        rounded = details.pop("score")
        return MetricScore(metric, s.name, s.score, sig, s.format(opts.width, False, sig), details,
                           rounded)
    if metric == "tok-bleu":
        lang = opts.lang or "en"
        r = tok_bleu_mod.tok_bleu(hyps, refs, lang, not opts.pretokenized, True, opts.lowercase,
                                 opts.normalize_quotes)
        sig = tok_bleu_mod.signature(lang, not opts.pretokenized, True, opts.lowercase,
                                     opts.normalize_quotes)
        details = {"precisions": r.precisions, "bp": r.bp, "ratio": r.ratio,
                   "hyp_len": r.hyp_len, "ref_len": r.ref_len}
        return MetricScore(metric, "tok-BLEU", r.score, sig, f"tok-BLEU|{sig} = {r.format()}",
                           details)
    if metric == "multi-bleu":
        tokenize = not opts.pretokenized
        r = tok_bleu_mod.literature_bleu(hyps, refs, opts.lang or "en", opts.lowercase,
                                         tokenize)
        sig = tok_bleu_mod.literature_signature(opts.lang or "en", opts.lowercase, tokenize)
        details = {"precisions": r.precisions, "bp": r.bp, "ratio": r.ratio,
                   "hyp_len": r.hyp_len, "ref_len": r.ref_len}
        return MetricScore(metric, "multi-BLEU", r.score, sig,
                           f"multi-BLEU|{sig} = {r.format()}", details, round(r.score, 2))
    return _bracket(hyps, refs, opts)


def _bracket(hyps: Sequence[str], refs: Sequence[Sequence[str]], opts: ScoreOptions) -> MetricScore:
    res = evalb_mod.evaluate(refs[0], hyps, opts.evalb, opts.retag, opts.names)
    for msg in res.errors[:20]:
        log.warning("bracket-f1: %s", msg)
    if len(res.errors) > 20:
        log.warning("bracket-f1: ... %d errors in all", len(res.errors))
    a, s = res.all, res.short
    sig = (f"evalb:{opts.evalb_name}|labeled:{'yes' if opts.evalb.labeled else 'no'}|"
           f"retag:{'xx' if opts.retag else 'no'}|version:nmt-{__version__}")
    text = (f"bracket-F1|{sig} = {a.f1:.2f} (R = {a.recall:.2f} P = {a.precision:.2f} "
            f"exact = {a.exact_match:.2f} valid = {a.valid}/{a.sentences} errors = "
            f"{a.error_sentences} skipped = {a.skip_sentences}; len<={res.cutoff}: F1 = {s.f1:.2f} "
            f"R = {s.recall:.2f} P = {s.precision:.2f} exact = {s.exact_match:.2f})")
    return MetricScore("bracket-f1", "bracket-F1", a.f1, sig, text, res.to_dict())


def sentence_scores(metric: str, hyps: Sequence[str], refs: Sequence[Sequence[str]],
                    opts: ScoreOptions | None = None) -> list[float]:
    """One score per hypothesis (sacreBLEU's sentence_score; tok-BLEU per line; bracket F1)."""
    opts = opts or ScoreOptions()
    _check(metric, hyps, refs)
    if metric in SACRE:
        m = _sacre_metric(metric, opts, None, sentence=True)
        return [m.sentence_score(h, list(rs)).score
                for h, *rs in zip(_strip(hyps), *[_strip(r) for r in refs])]
    if metric == "tok-bleu":
        lang = opts.lang or "en"
        return [tok_bleu_mod.tok_bleu([h], [[r] for r in rs], lang, not opts.pretokenized,
                                      True, opts.lowercase, opts.normalize_quotes).score
                for h, *rs in zip(hyps, *refs)]
    if metric == "multi-bleu":
        lang = opts.lang or "en"
        return [tok_bleu_mod.literature_bleu([h], [[r] for r in rs], lang, opts.lowercase,
                                             not opts.pretokenized).score
                for h, *rs in zip(hyps, *refs)]
    res = evalb_mod.evaluate(refs[0], hyps, opts.evalb, opts.retag, opts.names)
    # NaN for the sentences the corpus F1 leaves out (errors and skips), as EVALB gives none
    return [s.f1 if s.status == evalb_mod.OK else float("nan") for s in res.sentences]


def _check(metric: str, hyps: Sequence[str], refs: Sequence[Sequence[str]]) -> None:
    if metric not in METRICS:
        raise UsageError(f"unknown metric {metric!r}{suggest(metric, METRICS)}")
    if not refs:
        raise UsageError("no reference given")
    if metric == "bracket-f1" and len(refs) != 1:
        raise UsageError("bracket-f1 takes exactly one reference (the gold trees)")
    if not hyps:
        raise NmtError("no hypotheses to score")
    for k, r in enumerate(refs):
        if len(r) != len(hyps):
            raise NmtError(f"reference {k + 1} has {len(r)} lines but there are "
                           f"{len(hyps)} hypotheses")
