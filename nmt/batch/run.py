"""Translate a file, stdin or a split of the training data to a file or stdout, as
nmt-generate does: one output line per input line, in input order; an --output that resumes
where a stopped run left off; N worker processes; under torchrun, a shard per rank merged by
rank 0. The entry point is :func:`translate_file`::

    from nmt.batch import GenerateConfig, translate_file

    cfg = GenerateConfig(input_path="test.en", output_path="test.de", beam=5)
    summary = translate_file(["checkpoint_best.pt"], cfg, workers=2)
    print(summary.sentences, summary.seconds)

What a run does is worked out once, by :func:`plan_run`, before anything is loaded.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import time
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator, Mapping, Protocol, Sequence

from nmt.batch.config import GenerateConfig
from nmt.batch.input import check_forced_targets
from nmt.batch.modes import build_translator, format_result, score_reference, translate_chunk
from nmt.batch.shards import Shard, finish, rank_named, torchrun_shard
from nmt.errors import NmtError, UsageError
from nmt.io import LineWriter, atomic_write, check_output_file, is_regular_file, mark_written
from nmt.signals import Interrupted, signals_deferred, stop_on_signals

log = logging.getLogger("nmt.generate")


class Progress(Protocol):
    """What a run reports to: called with each batch's number of input lines; ``tokens``
    is set to the target tokens written so far."""

    tokens: int

    def __call__(self, n: int) -> None: ...


# (total lines or None when unknown, lines done before this run) -> a context manager that
# gives the Progress; nmt-generate's draws a bar on stderr
ProgressFactory = Callable[[int | None, int], ContextManager[Progress]]


class _Silent:
    """The progress of a run that shows none."""

    tokens = 0

    def __call__(self, n: int) -> None:
        pass

    def __enter__(self) -> "_Silent":
        return self

    def __exit__(self, *exc) -> None:
        pass


def silent(total: int | None, done_before: int) -> _Silent:
    return _Silent()


@dataclass
class Summary:
    """What a run did: input lines translated (or pairs scored), target tokens written, the
    wall time; ``already_complete``: --output held this very run's finished output, so
    nothing was done."""
    sentences: int = 0
    tokens: int = 0
    seconds: float = 0.0
    already_complete: bool = False


@dataclass(frozen=True)
class Plan:
    """What a run does, worked out once from its options: translate ``split`` of the
    checkpoint's data directory, or lines of --input / stdin; score given pairs
    (--score-reference) or translate; in this process, in ``workers`` worker processes, or
    as this torchrun rank's ``shard``; and whether --output resumes (an --output FILE
    translating an --input that is a regular file)."""
    split: str | None
    score: bool
    workers: int
    shard: Shard | None
    resumable: bool


def plan_run(cfg: GenerateConfig, workers: int = 1) -> Plan:
    """The run's Plan, or a one-line UsageError for options that exclude each other."""
    if workers < 1:
        raise UsageError(f"workers must be >= 1, got {workers}")
    check_split(cfg)
    if cfg.split is not None and (cfg.input_format != "text" or cfg.score_reference):
        raise UsageError("--input-format jsonl and --score-reference read --input or stdin, "
                         "not a --split")
    if workers > 1 and (cfg.split is not None or cfg.score_reference):
        raise UsageError("--workers translates --input or stdin, not a --split or "
                         "--score-reference")
    shard = torchrun_shard(cfg, workers)
    resumable = not (cfg.output_path in (None, "-") or cfg.split is not None
                     or cfg.score_reference or cfg.input_path in (None, "-")
                     or not is_regular_file(cfg.input_path) or is_stream(cfg.output_path))
    return Plan(cfg.split, cfg.score_reference, workers, shard, resumable)


def check_split(cfg: GenerateConfig) -> None:
    """--split and --input exclude each other (a one-line UsageError)."""
    if cfg.split is not None and cfg.input_path is not None:
        raise UsageError("--split and --input exclude each other: translate a split of the "
                         "checkpoint's data directory, or a file")


def translate_file(checkpoints: Sequence[str | os.PathLike], cfg: GenerateConfig, *,
                   device: str = "cpu", precision: str = "fp32", threads: int | None = None,
                   workers: int = 1, overwrite: bool = False, shard_timeout: float = 60.0,
                   progress: ProgressFactory = silent, verbose: bool = False,
                   quiet: bool = True, setup_logging: Callable[[bool, bool], None] | None = None,
                   loaded: Mapping[str, Any] | None = None) -> Summary:
    """Translate (or score) what ``cfg`` names, with one checkpoint or an ensemble of
    ``checkpoints``: --input (``cfg.input_path``; None or "-": stdin) or ``cfg.split``, to
    ``cfg.output_path`` (None or "-": stdout), one output line per input line, in order.

    An output FILE is written under a temporary name and renamed when complete; when it
    translates an input file it is resumable: a rerun of the same run continues after the
    last complete chunk (``cfg.buffer_size`` lines) and gives a byte-identical file; a rerun
    that differs is refused unless ``overwrite``, which also replaces a file nmt did not
    write. ``workers`` > 1: that many processes on this machine, each with ``threads //
    workers`` threads (``verbose``/``quiet``/``setup_logging``: how they log). Under torchrun
    (WORLD_SIZE > 1), this rank translates its share and rank 0 merges the shares, waiting up
    to ``shard_timeout`` minutes for a rank's next chunk. ``loaded``: the first checkpoint,
    already read with nmt.checkpoint.load_checkpoint. SIGINT/SIGTERM stop after the lines
    being written (nmt.signals.Interrupted says what was kept)."""
    cfg = check_output(cfg)
    paths = [str(p) for p in checkpoints]
    if not paths:
        raise UsageError("no checkpoint to translate with")
    plan = plan_run(cfg, workers)
    with rank_named(plan.shard):
        _check_output_target(cfg, paths, overwrite)
        out = _resumable(cfg, plan, paths, device, precision, overwrite)
        if out is ALREADY_COMPLETE:
            log.info("%s is already complete: this command wrote it with the same checkpoints, "
                     "input and options (--overwrite translates again)", cfg.output_path)
            return Summary(already_complete=True)
        with out.lock if out is not None else nullcontext():
            decoder = None
            if plan.shard is None or not out.complete:  # a restarted rank with its share done
                # (CTranslate2 picks a rank's GPU itself, without torch)       loads nothing
                rank_device = (plan.shard.device(device) if plan.shard and cfg.engine == "nmt"
                               else device)
                sources = [loaded, *paths[1:]] if loaded is not None else paths
                decoder = _Decoder.build(sources, paths, cfg, plan, rank_device, precision,
                                         threads, (verbose, quiet, setup_logging))
            return _run(decoder, cfg, plan, out, progress, shard_timeout)


def is_stream(path: str) -> bool:
    """Whether --output names something that exists and is neither a regular file nor a
    directory (a FIFO, /dev/stdout, /dev/null): it is written through, never replaced."""
    return os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path)


def check_output(cfg: GenerateConfig) -> GenerateConfig:
    """Refuse, before anything is loaded, an --output that cannot be written (a directory, a
    missing folder) and a closed stdin or stdout that the run would use; a symbolic link
    is followed (the file it names is written, the link kept)."""
    if cfg.input_path in (None, "-") and cfg.split is None and sys.stdin is None:
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


@dataclass
class _Decoder:
    """What translates: a Translator in this process, or the (workers, WorkerSpec) of a
    --workers pool; ``source``: the first checkpoint (a path, or what was read from it),
    whose data directory holds a --split."""
    translator: Any = None
    pool: tuple | None = None
    source: Any = None

    @classmethod
    def build(cls, sources: Sequence, paths: list[str], cfg: GenerateConfig, plan: Plan,
              device: str, precision: str, threads: int | None, logging_: tuple) -> "_Decoder":
        """``logging_``: the workers' (verbose, quiet, setup_logging)."""
        checkable = (cfg.input_format == "jsonl" and cfg.input_path not in (None, "-")
                     and is_regular_file(cfg.input_path))
        if cfg.engine != "nmt":
            sources = paths     # converted from the file (and once, before any worker starts)
            from nmt.engines.ctranslate2 import converted_model, stored_weights

            converted_model(paths[0], stored_weights(precision))
        if plan.workers > 1:
            from nmt.batch.workers import WorkerSpec, worker_threads

            if checkable:
                # Before any worker writes: a line found bad mid-run would stop every rerun
                # of a resumable --output at that line.
                check_forced_targets(cfg.input_path,
                                     lambda: build_translator(sources, cfg, "cpu", "fp32", 1),
                                     cfg.buffer_size)
            spec = WorkerSpec(paths, cfg, device, precision,
                              worker_threads(threads, plan.workers), *logging_)
            log.info("%d workers x %d thread(s)", plan.workers, spec.threads)
            return cls(pool=(plan.workers, spec), source=sources[0])
        translator = build_translator(sources, cfg, device, precision, threads)
        if checkable:
            check_forced_targets(cfg.input_path, lambda: translator, cfg.buffer_size)
        _log_decoding(translator, cfg)
        return cls(translator=translator, source=sources[0])


def _run(decoder: _Decoder | None, cfg: GenerateConfig, plan: Plan, resumable,
         progress: ProgressFactory, shard_timeout: float) -> Summary:
    """Translate, and say how fast; under torchrun, then finish the shards
    (nmt.batch.shards.finish). ``decoder`` None: a restarted rank whose share is done."""
    start = time.perf_counter()
    writer = _Writer(cfg.output_format, cfg.nbest)
    summary = Summary()
    with stop_on_signals():
        try:
            if decoder is not None:
                _generate(decoder, cfg, plan, writer, progress, resumable)
                summary = Summary(writer.sentences, writer.tokens, time.perf_counter() - start)
                log.info("translated %d sentences (%d target tokens) in %.1f s: %.1f "
                         "sentences/s, %.0f tokens/s", summary.sentences, summary.tokens,
                         summary.seconds, summary.sentences / max(summary.seconds, 1e-9),
                         summary.tokens / max(summary.seconds, 1e-9))
            if plan.shard is not None:
                finish(resumable, cfg, shard_timeout)
        except Interrupted as e:
            if resumable is not None and resumable.installed:   # the signal came too late
                log.warning("%s came once %s was written in full: nothing to stop",
                            signal.Signals(e.signum).name, cfg.output_path)
                return summary
            done = (resumable.stopped() if resumable is not None
                    else f"{cfg.output_path} not written" if cfg.output_path not in (None, "-")
                    else f"the output holds the first {writer.sentences} lines' translations")
            raise Interrupted(e.signum, done) from None
    return summary


def _check_output_target(cfg: GenerateConfig, paths: Sequence[str], overwrite: bool) -> None:
    """--output is never one of the run's inputs, nor a file nmt did not write (unless
    --overwrite); what an interrupted run of it left is resumed, as before."""
    from nmt.batch.shards import leftovers

    if cfg.output_path in (None, "-"):
        return
    check_output_file(cfg.output_path, [*paths, cfg.input_path, cfg.reference], overwrite,
                      resuming=bool(leftovers(Path(cfg.output_path))))


ALREADY_COMPLETE = object()     # _resumable(): --output holds this very run's finished output


def _resumable(cfg: GenerateConfig, plan: Plan, checkpoints: Sequence[str], device: str,
               precision: str, overwrite: bool):
    """The resumable output (nmt.batch.resumable) of a run that can have one, else None; under
    torchrun, this rank's shard (nmt.batch.shards). Refuses a rerun that differs from the
    interrupted one (another world size too) before anything is loaded."""
    if not plan.resumable:
        return None
    from nmt.batch.resumable import ResumableOutput, output_lock, run_identity
    from nmt.batch.shards import ShardOutput, check_other_runs, first_attempt, shard_path

    identity = run_identity(checkpoints, cfg, device, precision)
    shard = plan.shard
    # One writer per output, held to the end (the output's ``lock``): two runs resuming one
    # journal would write their chunks over each other in one partial file. The one process,
    # or rank 0 (which merges), holds OUT's lock; each rank also its shard's, until the merge.
    lock = ExitStack()
    try:
        if shard is None or shard.rank == 0:
            lock.callback(output_lock(cfg.output_path).release)
        if shard is not None:
            lock.callback(output_lock(shard_path(cfg.output_path, shard.rank,
                                                 shard.world)).release)
            overwrite = overwrite and first_attempt()       # a restarted rank resumes
        if not overwrite and _finished_before(cfg, identity):
            lock.close()
            return ALREADY_COMPLETE
        if shard is None:
            check_other_runs(cfg.output_path, 1, overwrite, remove=True)
            return ResumableOutput(cfg.output_path, identity, overwrite, lock=lock)
        check_other_runs(cfg.output_path, shard.world, overwrite, remove=shard.rank == 0)
        return ShardOutput(cfg.output_path, identity, shard, overwrite, lock=lock)
    except BaseException:
        lock.close()
        raise


def _finished_before(cfg: GenerateConfig, identity: dict) -> bool:
    """--output holds what this run (its identity, already plain JSON data) wrote in full, and
    no interrupted run has left anything beside it."""
    from nmt.batch.shards import leftovers
    from nmt.io import written_record

    record = written_record(cfg.output_path)
    return (record is not None and record.get("identity") == identity
            and not leftovers(Path(cfg.output_path)))


def _generate(decoder: _Decoder, cfg: GenerateConfig, plan: Plan, writer: "_Writer",
              progress: ProgressFactory, resumable=None) -> None:
    """Translate (or score) what ``plan`` says into ``writer``'s output."""
    if resumable is not None:
        with resumable as out:
            writer.out, writer.commit = out.writer, out.commit
            _translate_lines(decoder, cfg, writer, progress, out.start_line, out.start_byte,
                             out.shard)
        return
    translator = decoder.translator
    with open_output(cfg.output_path) as out:
        writer.out = out
        if plan.score:
            with progress(None, 0) as shown:
                score_reference(translator, cfg, writer, shown)
        elif plan.split is not None:
            from nmt.search.translator import load_split

            ids, texts = load_split(decoder.source, plan.split,
                                    src_codec=translator.src_codec,
                                    texts=cfg.output_format == "jsonl")
            with progress(len(ids), 0) as shown:
                writer(translator.translate_ids(ids, sources=texts, progress=shown,
                                                scores=cfg.output_format == "jsonl"))
        else:
            _translate_lines(decoder, cfg, writer, progress)


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


def _translate_lines(decoder: _Decoder, cfg: GenerateConfig, emit: _Writer,
                     progress: ProgressFactory, start_line: int = 1, start_byte: int = 0,
                     shard: Shard | None = None) -> None:
    """Raw lines (text or jsonl requests) from --input or stdin, a chunk at a time
    (nmt.batch.input), from ``start_line`` (at ``start_byte``) of an --input file; by the
    decoder's translator or workers; under torchrun, only ``shard``'s chunks (its rank shows
    no progress unless it is rank 0)."""
    from nmt.batch.input import input_chunks

    chunks, total = input_chunks(cfg, start_line, start_byte)
    done_before = start_line - 1
    if shard is not None:
        total, done_before = shard.lines(total), shard.lines(start_line - 1)
        if shard.rank != 0:
            progress = silent
    with progress(total, done_before) as shown:
        if decoder.pool is not None:
            from nmt.batch.workers import WorkerPool

            with WorkerPool(*decoder.pool) as workers:
                for texts, lines, tokens, done in workers.translate(chunks, start_line, shown):
                    emit.write_texts(texts, lines, tokens, done)
                    shown.tokens = emit.tokens
            return
        share = shard or Shard(0, 1, 0, cfg.buffer_size)      # one process: every chunk
        for first, chunk, offset in share.numbered(chunks, start_line):
            results, texts = translate_chunk(decoder.translator, cfg, chunk, first, shown)
            emit(results, texts, (first + len(chunk) - 1, offset))
            shown.tokens = emit.tokens
