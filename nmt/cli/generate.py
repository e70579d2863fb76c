"""nmt-generate: translate raw sentences with one checkpoint or an ensemble (beam search).

One output line per input line, in input order (an empty line gives an empty line). The work
is nmt.batch.run.translate_file (resumable output, workers, torchrun shards) over
nmt.search.translator.Translator; the options are the fields of nmt.batch.config.GenerateConfig
(plus the shared --device/--precision/--threads/-v/-q); this module parses them, reads the
checkpoint path in pipeline mode and draws the progress bar.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import click

from nmt.batch.config import GenerateConfig
from nmt.batch.run import check_output, check_split, translate_file
from nmt.cli.console import (Command, handle_errors, make_progress, read_path_from_stdin,
                            setup_logging, setup_runtime)
from nmt.cli.options import build_config, config_options, runtime_options
from nmt.errors import UsageError

class _Progress:
    """A rich bar on stderr (drawn only on a terminal; none under -q) showing lines/s, target
    tokens/s (once a chunk is written: ``tokens``) and the time left when the total is
    known (an --input file)."""

    def __init__(self, total: int | None, quiet: bool, done_before: int = 0):
        self.done = self.tokens = 0
        self.done_before = done_before
        self.start = time.perf_counter()
        self.bar = None if quiet else make_progress()
        self.task = None
        self.total = total

    def __enter__(self):
        if self.bar is not None:
            self.bar.start()
            self.task = self.bar.add_task("translating", total=self.total, rate="",
                                          completed=self.done_before)
        return self

    def __call__(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            elapsed = max(time.perf_counter() - self.start, 1e-9)
            rate = f"{self.done / elapsed:.1f} lines/s"
            if self.tokens:
                rate += f", {self.tokens / elapsed:.0f} tokens/s"
            self.bar.update(self.task, advance=n, rate=rate)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()


@click.command(cls=Command, prog="nmt-generate",
               context_settings={"help_option_names": ["-h", "--help"],
                                 "max_content_width": 100})
@click.argument("checkpoints", nargs=-1, type=click.Path())
@config_options(GenerateConfig)
@click.option("--workers", type=int, default=1, show_default=True,
              help="Decoding processes on this machine, each with its own model and "
                   "--threads // N threads (0: one per CPU this process may use, as in "
                   "nmt-preprocess); chunk i of --buffer-size lines goes to worker i mod N, "
                   "and the output is the one-process output, in input order. Across GPUs "
                   "or machines: torchrun (each rank one process; see below).")
@click.option("--shard-timeout", type=float, default=60.0, show_default=True,
              help="Under torchrun (-i FILE --output OUT): rank 0, its share done, waits "
                   "for the other ranks' shards (OUT.shard-R-of-W.*) and merges them into "
                   "OUT; it gives up when one has not finished a chunk in this many minutes.")
@click.option("--overwrite", is_flag=True,
              help="Replace an existing --output that nmt did not write (it is refused "
                   "otherwise; an input never is), translate again an --output this command "
                   "already completed, and start afresh instead of resuming what an "
                   "interrupted run left (OUTPUT.nmt-partial and OUTPUT.nmt-progress.json).")
@runtime_options("generate")
@handle_errors("nmt-generate")
def main(checkpoints, device, precision, threads, verbose, quiet, overwrite, workers,
         shard_timeout, **options):
    """Translate with CHECKPOINT (several: an ensemble averaging their probabilities).

    Reads raw sentences (--input or stdin), writes detokenized translations to stdout (or
    --output), one line per input line, in order. The subword model and vocabulary come from
    the checkpoint. Decoding is the paper's: beam 4, length penalty 0.6, at most
    source length + 50 tokens, unless the checkpoint's preset or the options say otherwise.

    With no CHECKPOINT, the first line of stdin is the checkpoint path (what nmt-train prints)
    and the --split (test) of its data directory is translated; with a CHECKPOINT, --split
    translates that split of the data directory it was trained on:

    \b
      nmt-preprocess ... | nmt-train ... | nmt-generate | nmt-score --ref test.de
      nmt-generate ckpt/checkpoint_best.pt < test.en > test.hyp
      nmt-generate a.pt b.pt c.pt -i test.en --output-format jsonl > test.jsonl

    --output with an --input file is resumable: after a kill, a SIGTERM, a reboot or a full
    disk, the same command continues after the last complete chunk (--buffer-size lines) and
    the finished file is byte-identical to an uninterrupted run's. A rerun with another
    checkpoint, input or decoding option is refused (--overwrite starts afresh). stdin cannot
    be resumed: a rerun reading stdin starts over.

    Under torchrun (WORLD_SIZE > 1) with -i FILE --output OUT, rank r of W translates the
    chunks i with i mod W = r into its own resumable shard beside OUT, and rank 0 merges the
    shards into OUT, byte-identical to one process; a rank that torchrun restarts
    (--max-restarts) resumes its shard:

    \b
      torchrun --nproc-per-node 8 --max-restarts 3 --no-python \\
          nmt-generate ckpt.pt -i mono.de --output bt.en --device cuda

    SIGINT (Ctrl-C) or SIGTERM stop it, after the lines being written if any (the output
    ends with whole lines, those of an uninterrupted run; --output: kept for a rerun to
    resume when it can, else not written), with exit code 130 or 143; a second signal stops
    at once.
    """
    setup_runtime(verbose, quiet, threads, torch_threads=options.get("engine", "nmt") == "nmt")
    cfg: GenerateConfig = check_output(build_config(GenerateConfig, options))
    if workers < 0:
        raise UsageError(f"--workers must be >= 0 (0: one per CPU), got {workers}")
    if workers == 0:
        from nmt.runtime import usable_cpus

        workers = usable_cpus()
    paths, loaded, cfg = _sources(checkpoints, cfg)
    translate_file(paths, cfg, device=device, precision=precision, threads=threads,
                   workers=workers, overwrite=overwrite, shard_timeout=shard_timeout,
                   progress=lambda total, done: _Progress(total, quiet, done),
                   verbose=verbose, quiet=quiet, setup_logging=setup_logging, loaded=loaded)


def _sources(checkpoints: Sequence[str], cfg: GenerateConfig):
    """(checkpoint paths, the first one as read in pipeline mode or None, cfg): with no
    CHECKPOINT, the first line of stdin names it and the --split (test) of its data
    directory is translated unless --input says otherwise."""
    if checkpoints:
        return list(checkpoints), None, cfg
    from nmt.runtime import env_dist_info

    if env_dist_info().world_size > 1:
        raise UsageError(f"under torchrun (WORLD_SIZE={env_dist_info().world_size}) name the "
                         f"CHECKPOINT: the ranks cannot share stdin")
    if cfg.input_path == "-":
        raise UsageError("with no CHECKPOINT, stdin holds the checkpoint path; give the "
                         "sentences with --input FILE")
    check_split(cfg)        # before stdin is read
    from nmt.checkpoint import load_checkpoint

    path = _checkpoint_from_stdin()
    if cfg.input_path is None and cfg.split is None:
        cfg = dataclasses.replace(cfg, split="test")
    return [path], load_checkpoint(path, mmap=True), cfg


def _checkpoint_from_stdin() -> str:
    """Pipeline mode: the first line of stdin is the checkpoint path nmt-train printed."""
    from pathlib import Path

    line = read_path_from_stdin("checkpoint")
    if not Path(line).exists():
        shown = line if len(line) <= 60 else line[:57] + "..."
        raise UsageError(f"no CHECKPOINT argument, so the first line of stdin was taken as a "
                         f"checkpoint path (pipeline mode), but '{shown}' is no such file; to "
                         f"translate stdin, name the checkpoint: nmt-generate CKPT < input")
    return line


if __name__ == "__main__":
    main()
