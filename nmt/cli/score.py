"""nmt-score: BLEU/chrF/TER (sacreBLEU), the paper's tokenized BLEU, and EVALB bracket F1.

    nmt-generate ... | nmt-score --ref test.de
    nmt-score --ref test.de --hyp out.de --metric bleu,chrf,tok-bleu --lang de --json
    nmt-score --ref test.de --hyp out.de --metric multi-bleu --lang de --lowercase
    nmt-score --ref test.gold --hyp test.trees --metric bracket-f1
"""

from __future__ import annotations

import json
import logging
import sys

import click

from nmt.cli.common import EMPTY_PIPE, Command, console, handle_errors, setup_logging
from nmt.cli.options import log_options
from nmt.errors import NmtError, UsageError
from nmt.io import LineWriter, read_lines
import nmt.metrics.evalb as evalb_mod
from nmt.metrics.scoring import METRICS, ScoreOptions, corpus_score, parse_metrics, sentence_scores

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


@click.command(cls=Command, prog="nmt-score",
               context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--ref", "-r", "refs", multiple=True, required=True, metavar="FILE",
              help="Reference file, one sentence (or gold tree) per line. Repeat for several "
                   "references.")
@click.option("--hyp", "-i", metavar="FILE", default=None,
              help="Hypotheses, one per line, in the references' order (default: stdin).")
@click.option("--metric", "-m", "metrics", multiple=True, metavar="NAME",
              help=f"Metric(s): {', '.join(METRICS)}. Repeat or separate with commas "
                   f"(default: bleu).")
@click.option("--json", "as_json", is_flag=True,
              help="Print JSON (an object for one metric, a list for several) instead of text.")
@click.option("--sentence", is_flag=True,
              help="Print one line of sentence-level scores per hypothesis (tab-separated, one "
                   "column per metric; JSON lines with --json); corpus scores go to stderr.")
@click.option("--tokenize", "-tok", type=click.Choice(TOKENIZERS), default=None,
              help="sacreBLEU tokenizer for BLEU (default: 13a, as sacreBLEU).")
@click.option("--lowercase", "-lc", is_flag=True,
              help="Case-insensitive BLEU and tok-BLEU (sacreBLEU's --lowercase); multi-bleu: "
                   "lowercase before normalizing and tokenizing, as the Multi30k papers do.")
@click.option("--force", is_flag=True,
              help="sacreBLEU --force: do not warn when the input looks tokenized.")
@click.option("--lang", "-l", default=None, metavar="LANG",
              help="Target language, the references': Moses rules of tok-bleu and multi-bleu "
                   "(which require it, e.g. de for En-De) and sacreBLEU's target language.")
@click.option("--pretokenized", is_flag=True,
              help="tok-bleu: the files are Moses-tokenized already; only split compounds.")
@click.option("--no-normalize-quotes", is_flag=True,
              help="tok-bleu only: keep Unicode quotes as they are. By default tok-bleu maps "
                   "„ “ ” ‟ « » 〝 〞 ＂ to \" and ‚ ‘ ’ ‛ ‹ › to ' in hypotheses and references "
                   "alike, as the reference of the paper's number was (tensor2tensor#317).")
@click.option("--chrf-word-order", type=click.IntRange(0, 10), default=0, show_default=True,
              help="chrF word n-gram order (2 gives chrF++).")
@click.option("--width", "-w", type=click.IntRange(0, 10), default=1, show_default=True,
              help="Decimals in sacreBLEU's text lines and sentence scores.")
@click.option("--evalb-params", metavar="FILE", default=None,
              help="bracket-f1: an EVALB parameter file (default: the settings of COLLINS.prm).")
@click.option("--max-errors", type=int, default=None, metavar="N",
              help="bracket-f1: EVALB's MAX_ERROR, stop (as EVALB does) once more than N+1 "
                   "errors were reported (default: from the parameters, 10; -1: never).")
@click.option("--no-retag", is_flag=True,
              help="bracket-f1: do not put the gold POS tags in place of XX tags.")
@click.option("--evalb-report", is_flag=True,
              help="bracket-f1: print EVALB's full report (per-sentence table and summary).")
@log_options
@handle_errors("nmt-score")
def main(refs, hyp, metrics, as_json, sentence, tokenize, lowercase, force, lang, pretokenized,
         no_normalize_quotes, chrf_word_order, width, evalb_params, max_errors, no_retag,
         evalb_report, verbose, quiet):
    """Score hypotheses against references; data on stdout, logs on stderr."""
    setup_logging(verbose, quiet)
    names = parse_metrics(metrics)
    params = (evalb_mod.EvalbParams.from_file(evalb_params) if evalb_params
              else evalb_mod.EvalbParams.collins())
    if max_errors is not None:
        params.max_error = max_errors
    opts = ScoreOptions(tokenize=tokenize, lowercase=lowercase, force=force, lang=lang,
                        chrf_word_order=chrf_word_order, width=width, pretokenized=pretokenized,
                        normalize_quotes=not no_normalize_quotes,
                        evalb=params, evalb_name=evalb_params or "COLLINS", retag=not no_retag,
                        names=(refs[0], hyp or "<stdin>"))
    for needs_lang in ("tok-bleu", "multi-bleu"):
        if needs_lang in names and lang is None:
            raise UsageError(f"--metric {needs_lang} needs --lang, the references' language "
                             f"(e.g. --lang de): it picks the Moses tokenizer's rules")
    if evalb_report and names != ["bracket-f1"]:
        raise UsageError("--evalb-report goes with --metric bracket-f1 alone")
    ref_lines = [_read(r, "reference") for r in refs]
    hyps = _read(hyp, "hypothesis")
    for r, lines in zip(refs, ref_lines):
        if len(lines) != len(hyps):
            raise NmtError(f"{hyp or '<stdin>'} has {len(hyps)} lines but {r} has {len(lines)}")

    if evalb_report:
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
        if sentence:
            columns = [sentence_scores(m, hyps, ref_lines, opts) for m in names]
            for i in range(len(hyps)):
                if as_json:
                    out.write(json.dumps({m: col[i] for m, col in zip(names, columns)}))
                else:
                    out.write("\t".join(f"{col[i]:.{width}f}" for col in columns))
        scores = [corpus_score(m, hyps, ref_lines, opts) for m in names]
        if sentence:
            out.flush()
            for s in scores:
                console.print(s.text, markup=False, highlight=False, soft_wrap=True)
        elif as_json:
            objs = [s.to_json() for s in scores]
            out.write(json.dumps(objs[0] if len(objs) == 1 else objs, indent=1))
        else:
            for s in scores:
                out.write(s.text)
    finally:
        out.close()


if __name__ == "__main__":
    main()
