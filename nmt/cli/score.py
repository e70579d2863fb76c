"""nmt-score: BLEU/chrF/TER (sacreBLEU), the paper's tokenized BLEU, and EVALB bracket F1.

    nmt-generate ... | nmt-score --ref test.de
    nmt-score --ref test.de --hyp out.de --metric bleu,chrf,tok-bleu --lang de --json
    nmt-score --ref test.de --hyp out.de --metric multi-bleu --lang de --lowercase
    nmt-score --ref test.gold --hyp test.trees --metric bracket-f1
"""

from __future__ import annotations

import json
import logging
import re
import sys
from dataclasses import dataclass

import click

from nmt.cli.console import EMPTY_PIPE, Command, console, handle_errors, setup_logging
from nmt.cli.options import build_config, config_options, log_options
from nmt.errors import NmtError, UsageError
from nmt.io import LineWriter, read_lines
import nmt.metrics.evalb as evalb_mod
from nmt.metrics.scoring import METRICS, ScoreOptions, corpus_score, parse_metrics, sentence_scores
from nmt.fields import option

log = logging.getLogger("nmt.score")
TOKENIZERS = ("none", "zh", "13a", "intl", "char", "ja-mecab", "ko-mecab", "spm", "flores101",
              "flores200")


def _read(path: str | None, what: str) -> list[str]:
    if path is None:
        if sys.stdin is None or sys.stdin.isatty():
            raise UsageError("no --hyp given and nothing piped on stdin")
        lines = read_lines(None, "<stdin>")
    else:
        lines = read_lines(path)
    if not lines and path is None:
        raise NmtError(f"no hypotheses: stdin was empty: {EMPTY_PIPE}")
    if not lines:
        raise NmtError(f"{path}: empty {what} file")
    return lines


@dataclass
class ScoreConfig:
    """nmt-score's options, written once (nmt.fields.option): what to score, how, and how
    the scores are printed."""

    refs: list[str] = option(
        help="Reference file, one sentence (or gold tree) per line. Repeat for several "
             "references.", flag="--ref", aliases=("--reference",), short="-r", multiple=True,
        metavar="FILE")
    hyp: str | None = option(
        None, "Hypotheses, one per line, in the references' order (default: stdin).",
        short="-i", metavar="FILE")
    metrics: list[str] = option(
        help=f"Metric(s): {', '.join(METRICS)}. Repeat or separate with commas (default: bleu).",
        flag="--metric", short="-m", multiple=True, metavar="NAME", default_factory=list)
    as_json: bool = option(
        False, "Print JSON (an object for one metric, a list for several) instead of text.",
        flag="--json")
    sentence: bool = option(
        False, "Print one line of sentence-level scores per hypothesis (tab-separated, one "
               "column per metric; JSON lines with --json); corpus scores go to stderr.")
    # --- sacreBLEU, tok-BLEU, multi-BLEU ---
    tokenize: str | None = option(
        None, "sacreBLEU tokenizer for BLEU (default: 13a, as sacreBLEU).", short="-tok",
        choices=TOKENIZERS)
    lowercase: bool = option(
        False, "Case-insensitive BLEU, chrF and tok-BLEU (sacreBLEU's --lowercase and "
               "--chrf-lowercase; the signatures say case:lc); multi-bleu: lowercase before "
               "normalizing and tokenizing, as the Multi30k papers do. Lowercasing is "
               "Unicode's (Ü to ü, as Moses' lowercase.perl), not multi-bleu.perl -lc's, which "
               "lowers A-Z alone. TER is case-insensitive already (sacreBLEU's default).",
        short="-lc")
    force: bool = option(False, "sacreBLEU --force: do not warn when the input looks tokenized.")
    lang: str | None = option(
        None, "Target language, the references': Moses rules of tok-bleu and multi-bleu (which "
              "require it, e.g. de for En-De) and sacreBLEU's target language.", short="-l",
        metavar="LANG")
    pretokenized: bool = option(
        False, "tok-bleu: the files are Moses-tokenized already; only split compounds. "
               "multi-bleu: the files are prepared already (normalized, Moses-tokenized with "
               "escaping, as the Multi30k release's *.lc.norm.tok.* files); only --lowercase "
               "applies.")
    no_normalize_quotes: bool = option(
        False, "tok-bleu only: keep Unicode quotes as they are. By default tok-bleu maps "
               "„ “ ” ‟ « » 〝 〞 ＂ to \" and ‚ ‘ ’ ‛ ‹ › to ' in hypotheses and references "
               "alike, as the reference of the paper's number was (tensor2tensor#317).")
    chrf_word_order: int = option(0, "chrF word n-gram order (2 gives chrF++).",
                                  cli_type=click.IntRange(0, 10))
    width: int = option(1, "Decimals in sacreBLEU's text lines and sentence scores.", short="-w",
                        cli_type=click.IntRange(0, 10))
    # --- bracket-f1 (EVALB) ---
    evalb_params: str | None = option(
        None, "bracket-f1: an EVALB parameter file (default: the settings of COLLINS.prm).",
        metavar="FILE")
    max_errors: int | None = option(
        None, "bracket-f1: EVALB's MAX_ERROR, stop (as EVALB does) once more than N+1 errors "
              "were reported (default: from the parameters, 10; -1: never).", metavar="N")
    no_retag: bool = option(False, "bracket-f1: do not put the gold POS tags in place of XX "
                                   "tags.")
    evalb_report: bool = option(False, "bracket-f1: print EVALB's full report (per-sentence "
                                       "table and summary).")

    def evalb(self) -> evalb_mod.EvalbParams:
        """The EVALB parameters: --evalb-params (else COLLINS.prm's), with --max-errors."""
        params = (evalb_mod.EvalbParams.from_file(self.evalb_params) if self.evalb_params
                  else evalb_mod.EvalbParams.collins())
        if self.max_errors is not None:
            params.max_error = None if self.max_errors < 0 else self.max_errors
        return params

    def score_options(self, params: evalb_mod.EvalbParams) -> ScoreOptions:
        return ScoreOptions(tokenize=self.tokenize, lowercase=self.lowercase, force=self.force,
                            lang=self.lang, chrf_word_order=self.chrf_word_order,
                            width=self.width, pretokenized=self.pretokenized,
                            normalize_quotes=not self.no_normalize_quotes, evalb=params,
                            evalb_name=self.evalb_params or "COLLINS", retag=not self.no_retag,
                            names=(self.refs[0], self.hyp or "<stdin>"))


def _check_lang(lang: str | None, names: list[str]) -> None:
    """--lang: a lowercase ISO 639 code (Moses' rules are keyed by it; any other spelling
    silently got generic rules), required by the Moses-tokenized metrics."""
    moses = [m for m in ("tok-bleu", "multi-bleu") if m in names]
    if lang is None:
        if moses:
            raise UsageError(f"--metric {moses[0]} needs --lang, the references' language "
                             f"(e.g. --lang de): it picks the Moses tokenizer's rules")
        return
    pair = re.fullmatch(r"[a-z]{2,3}-([a-z]{2,3})", lang)
    if pair:
        raise UsageError(f"--lang is the target language alone, not a pair (sacreBLEU's -l "
                         f"takes a pair): --lang {pair.group(1)}")
    if not re.fullmatch(r"[a-z]{2,3}", lang):
        code = re.split(r"[-_]", lang)[0].lower()
        hint = f" (did you mean --lang {code}?)" if re.fullmatch(r"[a-z]{2,3}", code) else ""
        raise UsageError(f"--lang takes a lowercase ISO 639 language code, got {lang!r}{hint}")
    if moses and lang not in _moses_languages():
        log.warning("--lang %s: Moses has no rules of its own for it (no nonbreaking "
                    "prefixes); %s tokenizes with its generic rules", lang, moses[0])


def _moses_languages() -> set[str]:
    from sacremoses.corpus import NonbreakingPrefixes

    return set(NonbreakingPrefixes().available_langs.values())


def _warn_if_jsonl(hyps: list[str], name: str) -> None:
    """Hypotheses that are nmt-generate's jsonl output (objects with a "translation") would be
    scored as text, braces and all (BLEU near 0): say so."""
    first = next((h for h in hyps if h.strip()), "")
    if not first.lstrip().startswith("{"):
        return
    try:
        obj = json.loads(first)
    except ValueError:
        return
    if isinstance(obj, dict) and "translation" in obj:
        log.warning("%s: the hypotheses look like nmt-generate's jsonl output and are scored "
                    "as text; write them with --output-format text (the default), or take "
                    "each line's \"translation\"", name)


@click.command(cls=Command, prog="nmt-score",
               context_settings={"help_option_names": ["-h", "--help"]})
@config_options(ScoreConfig)
@log_options
@handle_errors("nmt-score")
def main(verbose, quiet, **options):
    """Score hypotheses against references; data on stdout, logs on stderr."""
    setup_logging(verbose, quiet)
    cfg: ScoreConfig = build_config(ScoreConfig, options)
    refs, hyp, width = cfg.refs, cfg.hyp, cfg.width
    if "-" in refs and hyp in (None, "-"):
        raise UsageError("--ref - and the hypotheses would both be read from stdin: give "
                         "--hyp FILE")
    names = parse_metrics(cfg.metrics)
    params = cfg.evalb()
    opts = cfg.score_options(params)
    _check_lang(cfg.lang, names)
    if cfg.evalb_report and names != ["bracket-f1"]:
        raise UsageError("--evalb-report goes with --metric bracket-f1 alone")
    if cfg.evalb_report and (cfg.as_json or cfg.sentence):
        raise UsageError(f"--evalb-report prints EVALB's text report, which has its sentence "
                         f"table already; leave out {'--json' if cfg.as_json else '--sentence'}")
    ref_lines = [_read(r, "reference") for r in refs]
    hyps = _read(hyp, "hypothesis")
    _warn_if_jsonl(hyps, hyp or "<stdin>")
    for r, lines in zip(refs, ref_lines):
        if len(lines) != len(hyps):
            raise NmtError(f"{hyp or '<stdin>'} has {len(hyps)} lines but {r} has {len(lines)}")

    if cfg.evalb_report:
        if len(refs) != 1:
            raise UsageError("bracket-f1 takes exactly one reference (the gold trees)")
        res = evalb_mod.evaluate(ref_lines[0], hyps, params, opts.retag,
                                 (refs[0], hyp or "<stdin>"))
        for msg in res.errors:
            log.warning("%s", msg)
        out = LineWriter(None)
        out.write_text(evalb_mod.format_report(res))
        out.close()
        return

    out = LineWriter(None)
    try:
        if cfg.sentence:
            columns = [sentence_scores(m, hyps, ref_lines, opts) for m in names]
            for i in range(len(hyps)):
                if cfg.as_json:
                    # (null: a sentence bracket-F1 leaves out, an error or a skip)
                    out.write(json.dumps({m: None if col[i] != col[i] else col[i]
                                          for m, col in zip(names, columns)}))
                else:
                    out.write("\t".join(f"{col[i]:.{width}f}" for col in columns))
        scores = [corpus_score(m, hyps, ref_lines, opts) for m in names]
        if cfg.sentence:
            out.flush()
            for s in scores:
                console.print(s.text, markup=False, highlight=False, soft_wrap=True)
        elif cfg.as_json:
            objs = [s.to_json() for s in scores]
            out.write(json.dumps(objs[0] if len(objs) == 1 else objs, indent=1))
        else:
            for s in scores:
                out.write(s.text)
    finally:
        out.close()


if __name__ == "__main__":
    main()
