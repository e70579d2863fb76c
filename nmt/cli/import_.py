"""nmt-import: another toolkit's model as an ordinary, self-contained nmt checkpoint.

    nmt-import fairseq wmt16.en-de/model.pt --data wmt16.en-de --bpe-codes wmt16.en-de/bpecodes \\
        --moses en-de -o ende.pt

The checkpoint (weights, configuration, dictionaries, the whole text pipeline and the source
toolkit's decoding defaults) is written atomically; its path is the one line on stdout, so
``nmt-import ... | nmt-generate`` reads it. Nothing of the imported file is executed.
"""

from __future__ import annotations

import sys

import click

from nmt.cli.common import die, handle_errors, setup_logging
from nmt.cli.options import log_options

CONTEXT = {"help_option_names": ["-h", "--help"]}


class Group(click.Group):
    """A click group whose usage errors are one line, as nmt.cli.common.Command's."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            rv = super().main(args, prog_name or "nmt-import", complete_var, False, **extra)
        except click.UsageError as e:
            die("nmt-import", " ".join(e.format_message().split()), 2)
        except click.ClickException as e:
            die("nmt-import", " ".join(e.format_message().split()), e.exit_code)
        except click.exceptions.Abort:
            die("nmt-import", "interrupted", 130)
        raise SystemExit(rv if isinstance(rv, int) else 0)


@click.group(cls=Group, context_settings=CONTEXT)
def main():
    """Import a fairseq or Hugging Face model as an nmt checkpoint."""


@main.command("fairseq", context_settings=CONTEXT)
@click.argument("checkpoint", metavar="CHECKPOINT")
@click.option("--data", "data", required=True, metavar="DICT_DIR",
              help="The directory with the model's dict.SRC.txt and dict.TGT.txt.")
@click.option("--bpe-codes", metavar="CODES",
              help="subword-nmt BPE codes (fairseq's --bpe subword_nmt --bpe-codes); needs "
                   "subword-nmt: pip install 'nmt[fairseq]'.")
@click.option("--sentencepiece", metavar="MODEL",
              help="A sentencepiece model (fairseq's --bpe sentencepiece).")
@click.option("--moses", metavar="SRC-TGT",
              help="Moses tokenization as fairseq's --tokenizer moses (source language for "
                   "the input, target language for detokenizing the output), e.g. en-de.")
@click.option("--moses-no-dash-splits", is_flag=True,
              help="As fairseq's --moses-no-dash-splits (default: hyphens split, '@-@').")
@click.option("--moses-no-escape", is_flag=True,
              help="As fairseq's --moses-no-escape (default: XML entities such as &amp;).")
@click.option("-s", "--source-lang", metavar="SRC",
              help="LANG of DICT_DIR/dict.LANG.txt for the source [default: the checkpoint's, "
                   "or the pair of DICT_DIR's train.SRC-TGT.* files, or --moses's].")
@click.option("-t", "--target-lang", metavar="TGT", help="... and for the target.")
@click.option("-o", "--output", required=True, metavar="PATH", help="The nmt checkpoint.")
@log_options
@handle_errors("nmt-import")
def fairseq(checkpoint, data, bpe_codes, sentencepiece, moses, moses_no_dash_splits,
            moses_no_escape, source_lang, target_lang, output, verbose, quiet):
    """Import a fairseq Transformer CHECKPOINT (fairseq 0.9 to 0.12). nmt-generate then
    decodes as fairseq-generate does by default (beam 5, --lenpen 1.0 dividing by the length,
    at most 200 tokens); any of its options still overrides. An architecture or option nmt
    cannot represent exactly is refused, naming it."""
    setup_logging(verbose, quiet)
    from nmt.checkpoint import save_checkpoint
    from nmt.importers.fairseq import import_fairseq

    ckpt = import_fairseq(checkpoint, data, bpe_codes=bpe_codes, sentencepiece=sentencepiece,
                          moses=moses, moses_no_dash_splits=moses_no_dash_splits,
                          moses_no_escape=moses_no_escape, source_lang=source_lang,
                          target_lang=target_lang)
    dest = save_checkpoint(ckpt, output)
    sys.stdout.write(f"{dest}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
