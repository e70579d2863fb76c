#!/usr/bin/env python3
"""Turn Penn Treebank .mrg files into parallel files for parsing as translation.

    python examples/parsing_wsj/prepare.py TREEBANK_DIR OUT_DIR \\
        --split train=0001-0159 --split valid=0160-0169 --split test=0170-0179

Splits select files by the number in their name (wsj_0172.mrg -> 172); for the full WSJ
treebank the standard splits are train=0200-2199 (sections 02-21), valid=2200-2299 (22),
test=2300-2399 (23). For each split it writes:

    OUT_DIR/{split}.words   source: the words, space-separated, one sentence per line
    OUT_DIR/{split}.lin     target: the linearized tree, (S (NP XX XX )NP ... )S, or with
                            --leaves words (S (NP John Smith )NP ... )S
    OUT_DIR/{split}.gold    the normalized gold tree, one per line, rooted at TOP (for EVALB)
    OUT_DIR/{split}.tags    the gold POS tags (to put back after de-linearization)
    OUT_DIR/{split}.rb      a right-branching baseline tree per line (for comparison)
    OUT_DIR/{split}.sig     with --signatures N: the words, those seen fewer than N times in
                            the train split replaced by their shape (UNK-Cap, UNK-NUM,
                            UNK-low-ing; nmt/tasks/signatures.py), the source to train on; the
                            lexicalized targets (--leaves words) then carry them as leaves too
    OUT_DIR/splits.json     per split, the files, sentences and words written (with
                            --substitute, how many of the train split's trees are new)

--substitute K appends to the train split K rounds of new trees made from its own by
substructure substitution (nmt/tasks/augment.py); the signatures count the original trees.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from nmt.cli.console import handle_errors, setup_logging  # noqa: E402
from nmt.io import atomic_write, read_lines  # noqa: E402
from nmt.tasks.parsing import SplitSpec, prepare_treebank, right_branching  # noqa: E402
from nmt.tasks.trees import to_string  # noqa: E402

DEFAULT_SPLITS = ("train=0001-0159", "valid=0160-0169", "test=0170-0179")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("inputs", nargs=-1, required=True, metavar="TREEBANK...")
@click.argument("out_dir", metavar="OUT_DIR")
@click.option("--split", "splits", multiple=True, metavar="NAME=FIRST-LAST",
              help="A split by file number range (repeatable). Default: "
                   + ", ".join(DEFAULT_SPLITS) + " (the ptb-sample layout).")
@click.option("--src-suffix", default="words", show_default=True,
              help="File suffix (language name for nmt-preprocess) of the source side.")
@click.option("--tgt-suffix", default="lin", show_default=True,
              help="File suffix (language name for nmt-preprocess) of the target side.")
@click.option("--leaves", type=click.Choice(["xx", "words"]), default="xx", show_default=True,
              help="What stands for a word in the target: XX (the paper's, after Vinyals et "
                   "al.), or the word itself (a lexicalized target: (NP the dog )NP).")
@click.option("--signatures", type=click.IntRange(min=0), default=0, show_default=True,
              metavar="N", help="Also write {split}.sig: words seen fewer than N times in the "
                                "train split replaced by a signature of their shape (0: no).")
@click.option("--train-sentences", type=click.IntRange(min=0), default=0, show_default=True,
              metavar="N", help="Keep only the first N sentences of the train split (in file "
                                "order; the signatures count those only): for learning "
                                "curves. 0: all.")
@click.option("--substitute", type=click.IntRange(min=0), default=0, show_default=True,
              metavar="K", help="Add K rounds of new training trees made by substructure "
                                "substitution: in each, every training tree gets one of its "
                                "phrases replaced by a phrase of the same label from another "
                                "training tree (Shi et al. 2021). Train split only. 0: no.")
@click.option("--substitute-seed", type=int, default=1, show_default=True,
              help="Seed of --substitute's choices.")
@handle_errors("prepare.py")
def main(inputs, out_dir, splits, src_suffix, tgt_suffix, leaves, signatures, train_sentences,
         substitute, substitute_seed):
    """Read TREEBANK files or directories (searched for *.mrg) and write OUT_DIR/{split}.*"""
    setup_logging()
    specs = [SplitSpec.parse(s) for s in (splits or DEFAULT_SPLITS)]
    summary = prepare_treebank(inputs, out_dir, specs, src_suffix, tgt_suffix, leaves,
                               signatures, train_sentences, substitute, substitute_seed)
    for name, info in summary.items():
        words = read_lines(Path(out_dir) / f"{name}.{src_suffix}")
        tags = read_lines(Path(out_dir) / f"{name}.tags")
        with atomic_write(Path(out_dir) / f"{name}.rb", "w") as fh:
            for w, t in zip(words, tags):
                fh.write(to_string(right_branching(w.split(), t.split())) + "\n")
        made = (f" ({info['substituted']} of them by substitution)"
                if "substituted" in info else "")
        click.echo(f"{name}: {info['files']} files, {info['sentences']} sentences{made}, "
                   f"{info['words']} words", err=True)


if __name__ == "__main__":
    main()
