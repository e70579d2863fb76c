"""nmt-import: a model trained by another toolkit as an ordinary nmt checkpoint.

    nmt-import huggingface opus-mt-en-de -o ende.pt       # a Marian (OPUS-MT) directory
    nmt-generate ende.pt < input.en > output.de

The checkpoint (weights, configuration, vocabularies, the whole text pipeline) is written
atomically; its path is the one line on stdout, so it composes like every nmt command.
"""

from __future__ import annotations

import sys

import click

from nmt.cli.common import Command, Group, handle_errors, setup_logging
from nmt.cli.options import log_options


@click.group(cls=Group, prog="nmt-import",
             context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """Import a model trained by another toolkit; nmt-generate, nmt-score, nmt-export,
    nmt-train --init-from and the Python Translator then take it as any nmt checkpoint."""


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
    from nmt.importers.huggingface import import_huggingface

    setup_logging(verbose, quiet)
    dest = import_huggingface(model_dir, out)
    sys.stdout.write(f"{dest}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
