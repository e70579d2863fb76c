"""nmt-import: a model trained by another toolkit as an ordinary nmt checkpoint.

    nmt-import huggingface opus-mt-en-de -o ende.pt       # a Marian (OPUS-MT) directory
    nmt-import fairseq wmt16.en-de/model.pt --data wmt16.en-de \
        --bpe-codes wmt16.en-de/bpecodes --moses en-de -o ende.pt   # a fairseq Transformer
    nmt-generate ende.pt < input.en > output.de

The checkpoint (weights, configuration, vocabularies, the whole text pipeline) is written
atomically; its path is the one line on stdout, so it composes like every nmt command.
"""

from __future__ import annotations

import sys

import click

from nmt.cli.console import Command, Group, handle_errors, setup_logging
from nmt.cli.options import log_options


@click.group(cls=Group, prog="nmt-import",
             context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """Import a model trained by another toolkit; nmt-generate, nmt-serve,
    nmt-export, nmt-train --init-from (on data encoded by nmt-preprocess --reuse-vocab CKPT)
    and the Python Translator then take it as any nmt checkpoint (nmt-export's CTranslate2
    format does not yet write out a fairseq import's text pipeline)."""


@main.command("huggingface", cls=Command, prog="nmt-import huggingface")
@click.argument("model_dir", metavar="MODEL_DIR")
@click.option("-o", "--output", "out", required=True, metavar="PATH",
              help="The nmt checkpoint to write.")
@log_options
@handle_errors("nmt-import")
def huggingface(model_dir, out, verbose, quiet):
    """Import the Marian model directory MODEL_DIR (OPUS-MT as transformers ships it:
    config.json, model.safetensors or pytorch_model.bin, source.spm, target.spm, vocab.json).
    The checkpoint decodes as transformers' generate() does (its num_beams, length_penalty,
    max_length); nmt-generate's options override any of them."""
    from nmt.interop.hf_import import import_huggingface

    setup_logging(verbose, quiet)
    dest = import_huggingface(model_dir, out)
    sys.stdout.write(f"{dest}\n")
    sys.stdout.flush()


@main.command("fairseq", cls=Command, prog="nmt-import fairseq")
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
    at most 200 tokens, never an empty output: --min-len 1); any of its options still
    overrides. An architecture or option nmt
    cannot represent exactly is refused, naming it."""
    setup_logging(verbose, quiet)
    from nmt.checkpoint import load_model_from_checkpoint, save_checkpoint
    from nmt.interop.foreign import check_output
    from nmt.interop.fairseq import import_fairseq

    dest = check_output(output, (checkpoint, bpe_codes, sentencepiece),
                        reads={data: ("dict.*.txt", "train.*-*.*")})
    ckpt = import_fairseq(checkpoint, data, bpe_codes=bpe_codes, sentencepiece=sentencepiece,
                          moses=moses, moses_no_dash_splits=moses_no_dash_splits,
                          moses_no_escape=moses_no_escape, source_lang=source_lang,
                          target_lang=target_lang)
    load_model_from_checkpoint(ckpt)      # every weight has the shape the config says
    dest = save_checkpoint(ckpt, dest)
    sys.stdout.write(f"{dest}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
