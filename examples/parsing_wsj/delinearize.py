#!/usr/bin/env python3
"""Turn generated linearized trees back into bracketed trees over the source words.

    python examples/parsing_wsj/delinearize.py OUT_DIR/test.words generated.lin \\
        --tags OUT_DIR/test.tags > test.trees
    nmt-score --ref OUT_DIR/test.gold --hyp test.trees --metric bracket-f1

Every input line yields exactly one tree (ill-formed output is repaired, see
nmt.tasks.parsing); GENERATED '-' or absent reads stdin. Without --tags the POS tags are XX,
which nmt-score's bracket-f1 replaces with the gold tags.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from nmt.cli.console import handle_errors, setup_logging  # noqa: E402
from nmt.io import LineWriter  # noqa: E402
from nmt.tasks.parsing import delinearize_file  # noqa: E402


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("words", metavar="WORDS")
@click.argument("generated", metavar="GENERATED", required=False)
@click.option("--tags", default=None, metavar="FILE",
              help="Gold or predicted POS tags, one line per sentence, to put in the trees.")
@click.option("--leaves", type=click.Choice(["xx", "words"]), default=None,
              help="What stands for a word in GENERATED: XX, or the words themselves "
                   "(prepare.py --leaves words). Default: told from GENERATED.")
@handle_errors("delinearize.py")
def main(words, generated, tags, leaves):
    """Write one bracketed tree per line of WORDS on stdout; repair counts on stderr."""
    setup_logging()
    trees, stats = delinearize_file(words, None if generated in (None, "-") else generated, tags,
                                    leaves)
    out = LineWriter(None)
    for t in trees:
        out.write(t)
    out.close()
    if stats:
        click.echo("repairs: " + ", ".join(f"{k}={v}" for k, v in sorted(stats.items())), err=True)


if __name__ == "__main__":
    main()
