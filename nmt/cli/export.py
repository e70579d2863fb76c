"""nmt-export: a checkpoint as a CTranslate2 or transformers (Marian) model directory, to
translate without nmt.

    nmt-export ckpt/checkpoint_best.pt ende-ct2 --format ctranslate2 --quantization int8
    nmt-export ende.pt ende-hf --format huggingface      # MarianMTModel.from_pretrained
    nmt-train data-bin ... | nmt-export - ende-ct2

CTranslate2 needs the optional ctranslate2 package (pip install 'nmt[export]'), huggingface
safetensors (pip install 'nmt[hf]', with transformers to run it). The directory (weights,
vocabularies, subword models, README.txt with the decoding settings that match nmt-generate)
is written under a temporary name beside OUT and renamed when complete; its path is the one
line on stdout.
"""

from __future__ import annotations

import logging

import click

from nmt.cli.console import Command, handle_errors, read_path_from_stdin, setup_logging
from nmt.cli.options import log_options
from nmt.errors import UsageError
from nmt.interop.ct2_export import FORMATS, QUANTIZATIONS, export_model
from nmt.io import print_line

# nmt-generate's --precision name of a weight type that CTranslate2 calls otherwise.
PRECISION_NAMES = {"fp32": "float32"}


@click.command(cls=Command, prog="nmt-export",
               context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("checkpoint", metavar="CKPT")
@click.argument("out", metavar="OUT")
@click.option("--format", "fmt", type=click.Choice(list(FORMATS)), default=FORMATS[0],
              show_default=True,
              help="What to export to: a CTranslate2 model directory, or a transformers "
                   "Marian directory (MarianMTModel, MarianTokenizer).")
@click.option("--quantization", "--precision", "quantization",
              type=click.Choice([*QUANTIZATIONS, *PRECISION_NAMES]), multiple=True,
              help="Weight type: float32 translates as nmt does (greedy decoding: token for "
                   "token); int8 and int8_float32 (the same for these models: 8-bit weights, "
                   "float32 for the rest) are faster and about 3.5 times smaller, with "
                   "slightly different translations. --precision is the same option under "
                   "nmt-generate's name, which also takes its spelling fp32 for float32.  "
                   "[default: float32]")
@click.option("--overwrite", is_flag=True,
              help="Replace OUT if it is a model directory nmt-export wrote (any other "
                   "non-empty directory is refused), as --overwrite does in every nmt command.")
@click.option("--force", is_flag=True, hidden=True, help="The old name of --overwrite.")
@log_options
@handle_errors("nmt-export")
def main(checkpoint, out, fmt, quantization, overwrite, force, verbose, quiet):
    """Export checkpoint CKPT ('-': the path piped on stdin, as nmt-train prints it) to the
    model directory OUT. README.txt in OUT says how to tokenize, translate and detokenize with
    CTranslate2 as nmt-generate does."""
    setup_logging(verbose, quiet)
    if force:
        logging.getLogger("nmt").warning("--force is the old name of --overwrite; it still works")
        overwrite = True
    quantization = _quantization(quantization)
    if checkpoint == "-":
        checkpoint = read_path_from_stdin("checkpoint")
    dest = export_model(checkpoint, out, format=fmt, quantization=quantization, force=overwrite)
    print_line(str(dest))


def _quantization(given: tuple[str, ...]) -> str:
    """The one weight type that --quantization/--precision name (given twice: the same)."""
    named = sorted({PRECISION_NAMES.get(q, q) for q in given})
    if len(named) > 1:
        raise UsageError(f"--quantization (or --precision) given as {' and '.join(given)}: "
                         f"give one weight type")
    return named[0] if named else "float32"


if __name__ == "__main__":
    main()
