"""nmt-preprocess: learn subwords and binarize parallel text into a data directory.

Prints exactly one line on stdout, the data directory's absolute path, so that
``nmt-preprocess ... | nmt-train ...`` works. Logs, progress and the summary go to stderr.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import click
from rich.table import Table

from nmt.cli.console import Command, console, handle_errors, make_progress, setup_logging
from nmt.cli.options import build_config, config_options, log_options
from nmt.data.prepare import CheckpointPipeline, PreprocessConfig, PreprocessResult, preprocess
from nmt.signals import stop_on_signals
from nmt.errors import NmtError
from nmt.io import print_line
from nmt.lock import WriterLock, make_directories, remove_if_empty

EPILOG = """\b
Examples:
  nmt-preprocess -s en -t de --trainpref corpus/train --validpref corpus/valid \\
      --testpref corpus/test --joined-dictionary --vocab-size 37000 --destdir data-bin/ende
  nmt-preprocess -s en -t de --testpref new/test --reuse-vocab data-bin/ende --destdir data-bin/new
  nmt-preprocess -s words -t tree --trainpref ptb/train --subword none --destdir data-bin/parse
"""


@click.command(cls=Command, prog="nmt-preprocess",
               context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
               epilog=EPILOG)
@config_options(PreprocessConfig)
@log_options
@handle_errors("nmt-preprocess")
def main(verbose: bool, quiet: bool, **options):
    """Learn subwords on parallel text and binarize it into a data directory for nmt-train.

    Reads PREFIX.SRC / PREFIX.TGT line-aligned UTF-8 files. Prints the data directory's path.
    A second nmt-preprocess into a --destdir being built stops at once, naming the first's PID.
    """
    setup_logging(verbose, quiet)
    cfg = build_config(PreprocessConfig, options)
    # SIGTERM (a scheduler, timeout) as Ctrl-C: the build's temporary directory is removed
    # on the way out, and the error is one line.
    with stop_on_signals(), destination_lock(cfg.destdir):
        pipeline = checkpoint_pipeline(cfg.reuse_vocab)
        if quiet:           # -q: warnings and errors only, no progress bar or summary
            result = preprocess(cfg, pipeline=pipeline)
        else:
            with make_progress() as progress:
                result = preprocess(cfg, progress, pipeline)
            if not result.up_to_date:
                console.print(summary_table(result))
    print_line(str(result.path))


def checkpoint_pipeline(reuse_vocab: str | None) -> CheckpointPipeline | None:
    """--reuse-vocab CKPT (a file): the checkpoint's text pipeline, read without its weights
    and without running code from it; None for a data directory or none."""
    if not reuse_vocab or not Path(reuse_vocab).is_file():
        return None
    from nmt.checkpoint import codecs_from_checkpoint, load_checkpoint

    ckpt = load_checkpoint(reuse_vocab, mmap=True)
    src, tgt = codecs_from_checkpoint(ckpt, reuse_vocab)
    return CheckpointPipeline(src, tgt, ckpt.get("src_lang"), ckpt.get("tgt_lang"))


@contextmanager
def destination_lock(destdir: str) -> Iterator[None]:
    """One nmt-preprocess per --destdir: the directory is built under a temporary name and
    renamed into place, so the lock is a file beside it, .DEST.lock (nmt.lock)."""
    dest = Path(destdir).expanduser().absolute()
    try:
        created = make_directories(dest.parent)
    except OSError as e:
        raise NmtError(f"{dest}: cannot create the data directory ({e.strerror or e})") from None
    try:
        with WriterLock(dest.parent / f".{dest.name}.lock", dest, "nmt-preprocess",
                        "wait for it to finish, or give another --destdir"):
            yield
    finally:
        remove_if_empty(created)


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
        # BPE-dropout: kept and the filter counts are over every sampled copy of the lines
        copies = st.bpe_dropout["copies"] if st.bpe_dropout else 1
        lines = f"{st.lines} x {copies}" if copies > 1 else str(st.lines)
        table.add_row(st.name, lines, str(st.kept), f"{st.src_tokens}/{st.tgt_tokens}",
                      f"{pct(st.src_unk, st.src_tokens)}/{pct(st.tgt_unk, st.tgt_tokens)}",
                      f(st.empty), f(st.too_long), f(st.ratio))
    return table


if __name__ == "__main__":
    main()
