"""nmt-preprocess: learn subwords and binarize parallel text into a data directory.

Prints exactly one line on stdout, the data directory's absolute path, so that
``nmt-preprocess ... | nmt-train ...`` works. Logs, progress and the summary go to stderr.
"""

from __future__ import annotations

import click
from rich.table import Table

from nmt.cli.common import console, handle_errors, make_progress, setup_logging
from nmt.data.preprocess import PreprocessConfig, PreprocessResult, preprocess

EPILOG = """\b
Examples:
  nmt-preprocess -s en -t de --trainpref corpus/train --validpref corpus/valid \\
      --testpref corpus/test --joined-dictionary --vocab-size 37000 --destdir data-bin/ende
  nmt-preprocess -s en -t de --testpref new/test --reuse-vocab data-bin/ende --destdir data-bin/new
  nmt-preprocess -s words -t tree --trainpref ptb/train --subword none --destdir data-bin/parse
"""


def _prefixes(values: tuple[str, ...]) -> list[str]:
    # fairseq habit: comma-separated prefixes; repeating the option works too.
    return [p for v in values for p in v.split(",") if p]


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
               epilog=EPILOG)
@click.option("-s", "--source-lang", required=True, help="Source language code (file suffix), e.g. en.")
@click.option("-t", "--target-lang", required=True, help="Target language code (file suffix), e.g. de.")
@click.option("--trainpref", metavar="PREFIX",
              help="Training data: PREFIX.SRC and PREFIX.TGT. Subwords and dictionaries are learned on it.")
@click.option("--validpref", metavar="PREFIX", multiple=True,
              help="Validation data (comma-separated or repeated for several sets: valid, valid1, ...).")
@click.option("--testpref", metavar="PREFIX", multiple=True,
              help="Test data (comma-separated or repeated for several sets: test, test1, ...).")
@click.option("--destdir", default="data-bin", show_default=True, type=click.Path(),
              help="Data directory to create (built under a temporary name, renamed when complete).")
@click.option("--overwrite", is_flag=True, help="Replace --destdir if it exists and is not empty.")
@click.option("--subword", type=click.Choice(["bpe", "wordpiece", "none"]), default=None,
              help="Subword model: bpe (sentencepiece), wordpiece (HuggingFace tokenizers, '##' "
                   "continuations) or none (whitespace tokens, for pre-tokenized input). "
                   "[default: bpe, or the reused vocabulary's kind]")
@click.option("--vocab-size", type=int, default=32000, show_default=True,
              help="Symbols per dictionary (one shared dictionary with --joined-dictionary), "
                   "including the 4 specials. A soft limit for bpe on small corpora.")
@click.option("--joined-dictionary", "joined", is_flag=True,
              help="One subword model and dictionary shared by both languages (the paper's 37k BPE).")
@click.option("--threshold", type=int, default=1, show_default=True,
              help="Minimum count: of a token for --subword none, of a merge for wordpiece.")
@click.option("--subword-sample", type=int, default=1_000_000, show_default=True,
              help="The subword learner sees at most this many sentence pairs, drawn uniformly at "
                   "random from the training data (keeps memory flat on huge corpora).")
@click.option("--character-coverage", type=float, default=1.0, show_default=True,
              help="bpe: share of characters covered by the model (0.9995 suits CJK); the rest "
                   "become <unk>.")
@click.option("--byte-fallback", is_flag=True,
              help="bpe: spell characters outside the model as UTF-8 bytes instead of <unk>.")
@click.option("--moses", is_flag=True,
              help="Moses-tokenize (sacremoses) before subwords; decoding detokenizes.")
@click.option("--reuse-vocab", metavar="DIR", type=click.Path(),
              help="Reuse both codecs (subword models and dictionaries) of an existing data "
                   "directory, so new data is encoded identically (fine-tuning, new test sets).")
@click.option("--srcdict", metavar="FILE", type=click.Path(),
              help="Reuse a source dictionary: DIR/dict.LANG.txt of a data directory (its subword "
                   "model comes along), or a plain 'symbol count' file with --subword none.")
@click.option("--tgtdict", metavar="FILE", type=click.Path(), help="Like --srcdict, for the target.")
@click.option("--max-len", type=int, default=250, show_default=True,
              help="Drop training pairs with a side longer than this many subword tokens (0: no limit).")
@click.option("--max-len-ratio", type=float, default=9.0, show_default=True,
              help="Drop training pairs whose longer side exceeds this many times the shorter "
                   "(0: no limit).")
@click.option("--filter-eval-splits", "filter_eval", is_flag=True,
              help="Filter valid/test too. Off by default: those keep every line (even empty) so "
                   "that output aligns with the references; what would be filtered is only counted.")
@click.option("--shard-size", type=int, default=0, show_default=True,
              help="Sentences per training shard (0: one shard).")
@click.option("--workers", type=int, default=0, show_default=True,
              help="Encoding processes (0: one per CPU).")
@click.option("--seed", type=int, default=1, show_default=True, help="Seed of the subword sample.")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors; no summary table.")
@handle_errors("nmt-preprocess")
def main(source_lang, target_lang, trainpref, validpref, testpref, destdir, overwrite, subword,
         vocab_size, joined, threshold, subword_sample, character_coverage, byte_fallback, moses,
         reuse_vocab, srcdict, tgtdict, max_len, max_len_ratio, filter_eval, shard_size, workers,
         seed, verbose, quiet):
    """Learn subwords on parallel text and binarize it into a data directory for nmt-train.

    Reads PREFIX.SRC / PREFIX.TGT line-aligned UTF-8 files. Prints the data directory's path.
    """
    setup_logging(verbose, quiet)
    cfg = PreprocessConfig(
        source_lang=source_lang, target_lang=target_lang, destdir=destdir, trainpref=trainpref,
        validpref=_prefixes(validpref), testpref=_prefixes(testpref), subword=subword,
        vocab_size=vocab_size, joined=joined, threshold=threshold, subword_sample=subword_sample,
        character_coverage=character_coverage, byte_fallback=byte_fallback, moses=moses,
        reuse_vocab=reuse_vocab, srcdict=srcdict, tgtdict=tgtdict, max_len=max_len,
        max_len_ratio=max_len_ratio, filter_eval=filter_eval, shard_size=shard_size,
        workers=workers, seed=seed, overwrite=overwrite)
    with make_progress() as progress:
        result = preprocess(cfg, progress)
    if not quiet:
        console.print(summary_table(result))
    click.echo(str(result.path))


def summary_table(result: PreprocessResult) -> Table:
    meta = result.meta
    s, t = meta["src_lang"], meta["tgt_lang"]
    vocab = meta["vocab"]
    sizes = (f"{vocab[s]['size']} joined" if meta["joined"]
             else f"{s} {vocab[s]['size']}, {t} {vocab[t]['size']}")
    table = Table(title=f"{result.path}  ({meta['subword']}, vocab {sizes}, "
                        f"{meta['seconds']:.1f}s)", title_justify="left")
    for col in ("split", "lines", "kept", f"tokens {s}/{t}", f"unk {s}/{t}", "empty",
                "too long", "ratio"):
        table.add_column(col, justify="left" if col == "split" else "right", no_wrap=True)

    def pct(unk: int, tok: int) -> str:
        return f"{100.0 * unk / tok:.2f}%" if tok else "-"

    for st in result.splits:
        # Eval splits are not filtered: show what would have been, in parentheses.
        f = (lambda n: str(n)) if st.filtered_applied else (lambda n: f"({n})")
        table.add_row(st.name, str(st.lines), str(st.kept), f"{st.src_tokens}/{st.tgt_tokens}",
                      f"{pct(st.src_unk, st.src_tokens)}/{pct(st.tgt_unk, st.tgt_tokens)}",
                      f(st.empty), f(st.too_long), f(st.ratio))
    return table


if __name__ == "__main__":
    main()
