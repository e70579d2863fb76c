"""nmt-generate: translate raw sentences with one checkpoint or an ensemble (beam search).

One output line per input line, in input order (an empty line gives an empty line). The real
work is nmt.search.translator.Translator; the options are the fields of
nmt.search.config.GenerateConfig (plus the shared --device/--precision/--threads/-v/-q); this
module reads, writes and reports progress.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import time
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Callable, Iterator, Sequence

import click

from nmt.batch.config import GenerateConfig
from nmt.batch.input import check_forced_targets
from nmt.batch.modes import build_translator, format_result, score_reference, translate_chunk
from nmt.cli.common import (Command, handle_errors, make_progress, read_path_from_stdin,
                            setup_logging, setup_runtime)
from nmt.batch.shards import Shard, finish, rank_named, torchrun_shard
from nmt.signals import Interrupted, signals_deferred, stop_on_signals
from nmt.cli.options import build_config, config_options, runtime_options
from nmt.errors import NmtError, UsageError
from nmt.io import LineWriter, atomic_write, check_output_file, is_regular_file, mark_written

log = logging.getLogger("nmt.generate")

@contextmanager
def open_output(path: str | None) -> Iterator[LineWriter]:
    """stdout (streamed), or a file written under a temporary name and renamed when complete,
    so that a crash never leaves a partial file that looks finished. Either way every byte is
    written (nmt.io.write_all) or the error names the output."""
    if path is None or path == "-":
        out = LineWriter(None)
        yield out
        out.close()
        return
    if is_stream(path):          # a FIFO or a device: written through, as stdout is
        try:
            f = open(path, "wb")
        except OSError as e:
            raise NmtError(f"{path}: cannot write ({e.strerror or e})") from None
        with f:
            yield LineWriter.over(f, path)
        return
    with atomic_write(path, "wb") as f:
        yield LineWriter.over(f, path)
    mark_written(path)


def is_stream(path: str) -> bool:
    """Whether --output names something that exists and is neither a regular file nor a
    directory (a FIFO, /dev/stdout, /dev/null): it is written through, never replaced."""
    return os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path)


def check_output(cfg: GenerateConfig) -> GenerateConfig:
    """Refuse, before anything is loaded, an --output that cannot be written (a directory, a
    missing folder) and a closed stdin or stdout that the run would use; a symbolic link
    is followed (the file it names is written, the link kept)."""
    if cfg.input_path in (None, "-") and sys.stdin is None:
        raise UsageError("stdin is closed: give --input FILE")
    out = cfg.output_path
    if out in (None, "-"):
        if sys.stdout is None:
            raise UsageError("stdout is closed: give --output FILE")
        return cfg
    if is_stream(out):
        # a FIFO or a device (/dev/stdout, whatever stdout is): written through as named;
        # its link's target (pipe:[N] for a pipe) is no path
        return cfg
    real = os.path.realpath(out)
    if os.path.isdir(real):
        raise UsageError(f"--output {out} is a directory: give the file to write")
    if not os.path.isdir(os.path.dirname(real) or "."):
        raise UsageError(f"--output {out}: the folder {os.path.dirname(real)} does not exist")
    return dataclasses.replace(cfg, output_path=real) if real != os.path.abspath(out) else cfg


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
@runtime_options
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
    shard = torchrun_shard(cfg, checkpoints, workers)
    with rank_named(shard):
        paths, sources, split = _sources(checkpoints, cfg)
        if workers > 1 and (split is not None or cfg.score_reference):
            raise UsageError("--workers translates --input or stdin, not a --split or "
                             "--score-reference")
        _check_output_target(cfg, paths, overwrite)
        resumable = _resumable(cfg, split, paths, device, precision, overwrite, shard)
        if resumable is ALREADY_COMPLETE:
            log.info("%s is already complete: this command wrote it with the same checkpoints, "
                     "input and options (--overwrite translates again)", cfg.output_path)
            return
        with resumable.lock if resumable is not None else nullcontext():
            if shard is not None and resumable.complete:
                translator = pool = None        # restarted with its share done: do not load
            else:
                # (CTranslate2 picks a rank's GPU itself, without torch)
                rank_device = shard.device(device) if shard and cfg.engine == "nmt" else device
                translator, pool = _decoder(sources, paths, cfg, rank_device, precision,
                                            (threads, verbose, quiet), workers)
            _run(translator, cfg, sources, split, quiet, resumable, pool, shard_timeout)


def _decoder(sources: Sequence, paths: list[str], cfg: GenerateConfig, device: str,
             precision: str, runtime: tuple, workers: int):
    """(translator, None), or (None, the --workers pool's (workers, WorkerSpec));
    ``runtime``: (--threads, -v, -q)."""
    checkable = (cfg.input_format == "jsonl" and cfg.input_path not in (None, "-")
                 and is_regular_file(cfg.input_path))
    if cfg.engine != "nmt":
        sources = paths         # converted from the file (and once, before any worker starts)
        from nmt.engines.ctranslate2 import converted_model

        for p in paths[:1]:
            converted_model(p)
    if workers > 1:
        from nmt.batch.workers import WorkerSpec, worker_threads

        if checkable:
            # Before any worker writes: a line found bad mid-run would stop every rerun of a
            # resumable --output at that line.
            check_forced_targets(cfg.input_path,
                                 lambda: build_translator(sources, cfg, "cpu", "fp32", 1),
                                 cfg.buffer_size)
        threads, verbose, quiet = runtime
        spec = WorkerSpec(paths, cfg, device, precision, worker_threads(threads, workers),
                          verbose, quiet, setup_logging)
        log.info("%d workers x %d thread(s)", workers, spec.threads)
        return None, (workers, spec)
    translator = build_translator(sources, cfg, device, precision, runtime[0])
    if checkable:
        check_forced_targets(cfg.input_path, lambda: translator, cfg.buffer_size)
    _log_decoding(translator, cfg)
    return translator, None


def _run(translator, cfg: GenerateConfig, sources: Sequence, split: str | None, quiet: bool,
         resumable, pool, shard_timeout: float) -> None:
    """Translate, and say how fast; under torchrun, then finish the shards
    (nmt.batch.shards.finish)."""
    start = time.perf_counter()
    writer = _Writer(cfg.output_format, cfg.nbest)
    shard = resumable.shard if resumable is not None else None
    with stop_on_signals():
        try:
            if translator is not None or pool is not None:
                _generate(translator, cfg, sources, split, writer, quiet, resumable, pool)
                elapsed = time.perf_counter() - start
                log.info("translated %d sentences (%d target tokens) in %.1f s: %.1f "
                         "sentences/s, %.0f tokens/s", writer.sentences, writer.tokens,
                         elapsed, writer.sentences / max(elapsed, 1e-9),
                         writer.tokens / max(elapsed, 1e-9))
            if shard is not None:
                finish(resumable, cfg, shard_timeout)
        except Interrupted as e:
            if resumable is not None and resumable.installed:   # the signal came too late
                log.warning("%s came once %s was written in full: nothing to stop",
                            signal.Signals(e.signum).name, cfg.output_path)
                return
            done = (resumable.stopped() if resumable is not None
                    else f"{cfg.output_path} not written" if cfg.output_path not in (None, "-")
                    else f"the output holds the first {writer.sentences} lines' translations")
            raise Interrupted(e.signum, done) from None


def _sources(checkpoints: Sequence[str], cfg: GenerateConfig
             ) -> tuple[list[str], Sequence, str | None]:
    """The checkpoint paths, what to load them from (paths, or the checkpoint that pipeline
    mode has read), and the split to translate (None: --input or stdin)."""
    pipeline = not checkpoints
    if cfg.split is not None and cfg.input_path is not None:
        raise UsageError("--split and --input exclude each other: translate a split of the "
                         "checkpoint's data directory, or a file")
    if pipeline:
        if cfg.input_path == "-":
            raise UsageError("with no CHECKPOINT, stdin holds the checkpoint path; give the "
                             "sentences with --input FILE")
        from nmt.checkpoint import load_checkpoint

        paths = [_checkpoint_from_stdin()]
        sources: Sequence = [load_checkpoint(paths[0], mmap=True)]
    else:
        paths = sources = list(checkpoints)
    split = cfg.split or ("test" if pipeline and cfg.input_path is None else None)
    if split is not None and (cfg.input_format != "text" or cfg.score_reference):
        raise UsageError("--input-format jsonl and --score-reference read --input or stdin, "
                         "not a --split")
    return paths, sources, split


def _check_output_target(cfg: GenerateConfig, paths: Sequence[str], overwrite: bool) -> None:
    """--output is never one of the run's inputs, nor a file nmt did not write (unless
    --overwrite); what an interrupted run of it left is resumed, as before."""
    from nmt.batch.shards import leftovers

    if cfg.output_path in (None, "-"):
        return
    check_output_file(cfg.output_path, [*paths, cfg.input_path, cfg.reference], overwrite,
                      resuming=bool(leftovers(Path(cfg.output_path))))


ALREADY_COMPLETE = object()     # _resumable(): --output holds this very run's finished output


def _resumable(cfg: GenerateConfig, split: str | None, checkpoints: Sequence[str],
               device: str, precision: str, overwrite: bool, shard: Shard | None = None):
    """The resumable output (nmt.batch.resume) of a run that can have one: --output
    FILE, translating an --input that is a regular file; else None. Under torchrun, this
    rank's shard (nmt.batch.shards). Refuses a rerun that differs from the
    interrupted one (another world size too) before anything is loaded."""
    if (cfg.output_path in (None, "-") or split is not None or cfg.score_reference
            or cfg.input_path in (None, "-") or not is_regular_file(cfg.input_path)
            or is_stream(cfg.output_path)):
        return None
    from nmt.batch.resume import ResumableOutput, output_lock, run_identity
    from nmt.batch.shards import ShardOutput, check_other_runs, first_attempt, shard_path

    identity = run_identity(checkpoints, cfg, device, precision)
    # One writer per output, held to the end (``out.lock``): two runs resuming one journal
    # would write their chunks over each other in one partial file. The one process, or
    # rank 0 (which merges), holds OUT's lock; each rank also its shard's, until the merge.
    lock = ExitStack()
    try:
        if shard is None or shard.rank == 0:
            lock.callback(output_lock(cfg.output_path).release)
        if shard is not None:
            lock.callback(output_lock(shard_path(cfg.output_path, shard.rank,
                                                 shard.world)).release)
        if shard is not None:
            overwrite = overwrite and first_attempt()       # a restarted rank resumes
        if not overwrite and _finished_before(cfg, identity):
            lock.close()
            return ALREADY_COMPLETE
        if shard is None:
            check_other_runs(cfg.output_path, 1, overwrite, remove=True)
            out = ResumableOutput(cfg.output_path, identity, overwrite)
        else:
            check_other_runs(cfg.output_path, shard.world, overwrite, remove=shard.rank == 0)
            out = ShardOutput(cfg.output_path, identity, shard, overwrite)
    except BaseException:
        lock.close()
        raise
    out.lock = lock
    return out


def _finished_before(cfg: GenerateConfig, identity: dict) -> bool:
    """--output holds what this run (its identity, already plain JSON data) wrote in full, and
    no interrupted run has left anything beside it."""
    from nmt.batch.shards import leftovers
    from nmt.io import written_record

    record = written_record(cfg.output_path)
    return (record is not None and record.get("identity") == identity
            and not leftovers(Path(cfg.output_path)))


def _generate(translator, cfg: GenerateConfig, sources: Sequence, split: str | None,
              writer: "_Writer", quiet: bool, resumable=None, pool=None) -> None:
    """Translate (or score) what ``cfg`` says into ``writer``'s output, with ``translator``
    or, for --workers, a pool of (workers, nmt.batch.workers.WorkerSpec)."""
    if resumable is not None:
        with resumable as out:
            writer.out, writer.commit = out.writer, out.commit
            _translate_lines(translator, cfg, writer, quiet, out.start_line, out.start_byte,
                             pool, out.shard)
        return
    with open_output(cfg.output_path) as out:
        writer.out = out
        if cfg.score_reference:

            with _Progress(None, quiet) as progress:
                score_reference(translator, cfg, writer, progress)
        elif split is not None:
            from nmt.search.translator import load_split

            ids, texts = load_split(sources[0], split, src_codec=translator.src_codec,
                                    texts=cfg.output_format == "jsonl")
            with _Progress(len(ids), quiet) as progress:
                writer(translator.translate_ids(ids, sources=texts, progress=progress))
        else:
            _translate_lines(translator, cfg, writer, quiet, pool=pool)


def _log_decoding(translator, cfg: GenerateConfig) -> None:
    s = translator.search
    if cfg.sampling:
        c = cfg.sampling_config
        how = (f"sampling (top-k {c.topk or 'all'}, top-p {c.topp:g}, temperature "
               f"{c.temperature:g}, seed {c.seed}), {s.nbest} per line")
    else:
        how = f"beam {s.beam}, lenpen {s.lenpen:g}"
        if s.formula != "gnmt":
            how += f" ({s.formula} formula)"
    log.info("%s, max length %g * source + %d, %s", how, s.max_len_a, s.max_len_b,
             translator.describe())
    if translator.constraints is not None:
        log.info("tree constraints: every output is a well-formed linearized tree")


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


class _Writer:
    """Writes each batch's output lines as they come (one flush per batch), whole: a SIGINT or
    SIGTERM during the write takes effect after it (a reader of a pipe never sees half a
    line); counts the lines."""

    def __init__(self, output_format: str, nbest: int):
        self.output_format, self.nbest = output_format, nbest
        self.out: LineWriter | None = None
        # A resumable output's commit(lines, input_bytes), called after each chunk's write.
        self.commit: Callable[[int, int], None] | None = None
        self.sentences = self.tokens = 0

    def __call__(self, results, texts: list[str] | None = None,
                 done: tuple[int, int | None] | None = None) -> None:
        """``done``: (input lines, input bytes) that these results complete."""
        if texts is None:
            texts = [format_result(r, self.output_format, self.nbest) for r in results]
        self.write_texts(texts, len(results),
                         sum(len(r.hypotheses[0].ids) for r in results if r.hypotheses), done)

    def write_texts(self, texts: list[str], sentences: int, tokens: int,
                    done: tuple[int, int | None] | None = None) -> None:
        self.write("".join(t + "\n" for t in texts), sentences, done)
        self.tokens += tokens

    def write(self, text: str, sentences: int,
              done: tuple[int, int | None] | None = None) -> None:
        with signals_deferred():
            self.out.write_text(text)
            self.out.flush()
            self.sentences += sentences
            if self.commit is not None and done is not None and done[1] is not None:
                self.commit(*done)


def _translate_lines(translator, cfg: GenerateConfig, emit: _Writer, quiet: bool,
                     start_line: int = 1, start_byte: int = 0, pool=None,
                     shard: Shard | None = None) -> None:
    """Raw lines (text or jsonl requests) from --input or stdin, a chunk at a time
    (nmt.batch.input), from ``start_line`` (at ``start_byte``) of an --input file;
    by ``translator``, or by the workers of ``pool`` (see _generate); under torchrun, only
    ``shard``'s chunks (its rank shows no progress bar unless it is rank 0)."""
    from nmt.batch.input import input_chunks

    chunks, total = input_chunks(cfg, start_line, start_byte)
    done_before = start_line - 1
    if shard is not None:
        total, done_before = shard.lines(total), shard.lines(start_line - 1)
        quiet = quiet or shard.rank != 0
    with _Progress(total, quiet, done_before) as progress:
        if pool is not None:
            from nmt.batch.workers import WorkerPool

            with WorkerPool(*pool) as workers:
                for texts, lines, tokens, done in workers.translate(chunks, start_line,
                                                                    progress):
                    emit.write_texts(texts, lines, tokens, done)
                    progress.tokens = emit.tokens
            return
        share = shard or Shard(0, 1, 0, cfg.buffer_size)      # one process: every chunk
        for first, chunk, offset in share.numbered(chunks, start_line):
            results, texts = translate_chunk(translator, cfg, chunk, first, progress)
            emit(results, texts, (first + len(chunk) - 1, offset))
            progress.tokens = emit.tokens


if __name__ == "__main__":
    main()
