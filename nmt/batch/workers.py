"""nmt-generate --workers N: N decoding processes on one machine, each with its own model and
--threads // N threads. This process reads the input and writes the output; chunk i (of
--buffer-size lines) goes to worker i mod N, and the translations come back and are written
in input order. Each chunk is translated exactly as one process translates it (same lines,
same batches, same line numbers for sampling seeds), so the output is the one-process output,
and a resumable --output (nmt.batch.resumable) resumes as it does with one process.

Workers are started with "spawn" (a fresh interpreter: no OpenMP state inherited through
fork) and hold at most two chunks each, so memory stays bounded whatever the input's size.
"""

from __future__ import annotations

import logging
import os
import queue
from dataclasses import dataclass
from typing import Callable, Iterator

from nmt.batch.config import GenerateConfig
from nmt.errors import NmtError
from nmt.search.config import thread_share

log = logging.getLogger("nmt.generate")

IN_FLIGHT = 2        # chunks queued per worker: one being translated, one waiting


@dataclass
class WorkerSpec:
    """What each worker needs to build its translator (all picklable)."""
    checkpoints: list[str]
    cfg: GenerateConfig
    device: str
    precision: str
    threads: int
    verbose: bool
    quiet: bool
    # how a worker sets up its logging (a module-level function: picklable), called with
    # (verbose, quiet); nmt-generate passes its own
    setup_logging: Callable[[bool, bool], None] | None = None


def _worker(spec: WorkerSpec, tasks, results) -> None:
    """A worker's life: build the translator, then translate (index, first line, chunk) tasks
    until None; send ("progress", n), ("done", index, texts, tokens) or ("error", message)."""
    import signal

    # Ctrl-C reaches the whole process group: the parent decides what happens, and ends us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    try:
        from nmt.batch.modes import build_translator, translate_chunk

        if spec.setup_logging is not None:
            spec.setup_logging(spec.verbose, spec.quiet)
        if spec.cfg.engine == "nmt":      # CTranslate2 takes its threads below, without torch
            import torch

            torch.set_num_threads(spec.threads)
        translator = build_translator(spec.checkpoints, spec.cfg, spec.device, spec.precision,
                                      spec.threads)
        results.put(("ready",))
        while (task := _next_task(tasks)) is not None:
            index, first, chunk = task
            out, texts = translate_chunk(translator, spec.cfg, chunk, first,
                                         lambda n: results.put(("progress", n)))
            tokens = sum(len(r.hypotheses[0].ids) for r in out if r.hypotheses)
            log.debug(
                "worker %d: lines %d-%d translated", os.getpid(), first, first + len(chunk) - 1)
            results.put(("done", index, texts, tokens))
    except NmtError as e:
        results.put(("error", str(e)))
    except Exception as e:  # noqa: BLE001 - reported by the parent as one line
        results.put(("error", f"internal error in a worker: {type(e).__name__}: {e}"))


def _die_with_parent() -> None:
    """On Linux, have the kernel kill this worker when its parent dies (kill -9 of
    nmt-generate): without it the worker translated its chunk on for seconds, for nobody.
    Elsewhere _next_task's check ends it between chunks."""
    import ctypes
    import multiprocessing
    import os
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)              # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    parent = multiprocessing.parent_process()
    if parent is not None and not parent.is_alive():     # it died before the prctl
        os._exit(1)


def _next_task(tasks):
    """The next task; if the parent has died (kill -9: it could not end us), exit: nobody
    will read what we write, and the rerun starts its own workers."""
    import multiprocessing
    import os

    parent = multiprocessing.parent_process()
    while True:
        try:
            return tasks.get(timeout=1.0)
        except queue.Empty:
            if parent is not None and not parent.is_alive():
                os._exit(1)


class WorkerPool:
    """``with WorkerPool(n, spec) as pool: for texts, lines, tokens, done in
    pool.translate(chunks, first_line, progress)``: the chunks' output lines in input order."""

    def __init__(self, n: int, spec: WorkerSpec):
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.results = ctx.Queue()
        self.tasks = [ctx.Queue() for _ in range(n)]
        self.procs = [ctx.Process(target=_worker, args=(spec, self.tasks[i], self.results),
                                  name=f"nmt-generate-worker-{i}", daemon=True)
                      for i in range(n)]

    def __enter__(self) -> "WorkerPool":
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            for q in self.tasks:
                q.put(None)
            for p in self.procs:
                p.join(timeout=30)
        for p in self.procs:            # an error or a signal: stop the rest now
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)

    def _next(self) -> tuple:
        """The next message from a worker; a worker that has died is an error."""
        while True:
            try:
                msg = self.results.get(timeout=0.5)
            except queue.Empty:
                dead = [p for p in self.procs if p.exitcode is not None]
                if dead:
                    raise NmtError(f"{dead[0].name} stopped (exit code {dead[0].exitcode}) "
                                   f"before finishing its lines") from None
                continue
            if msg[0] == "error":
                raise NmtError(msg[1])
            return msg

    def translate(self, chunks: Iterator[tuple[list, int | None]], first_line: int,
                  progress: Callable[[int], None]
                  ) -> Iterator[tuple[list[str], int, int, tuple[int, int | None]]]:
        """For each chunk, in order: its output texts, its line count, its target tokens and
        (the last input line it completes, the input byte offset past it)."""
        n = len(self.procs)
        meta: dict[int, tuple[int, int | None]] = {}     # index -> (lines, offset)
        done: dict[int, tuple[list[str], int]] = {}
        sent = out = 0
        first = first_line
        feed = _read_ahead(chunks, IN_FLIGHT * n)
        exhausted = False
        while True:
            while not exhausted and sent - out < IN_FLIGHT * n:
                # Wait for input only when no chunk is out: a stream's translations must not
                # wait for its next line (a caller writes a line and waits for the answer).
                try:
                    item = feed.get(block=sent == out)
                except queue.Empty:
                    break
                if isinstance(item, BaseException):
                    raise item
                if item is None:
                    exhausted = True
                    break
                chunk, offset = item
                self.tasks[sent % n].put((sent, first, chunk))
                meta[sent] = (len(chunk), offset)
                first += len(chunk)
                sent += 1
            if out == sent:
                return
            msg = self._next()
            if msg[0] == "progress":
                progress(msg[1])
            elif msg[0] == "done":
                done[msg[1]] = (msg[2], msg[3])
            while out in done:
                texts, tokens = done.pop(out)
                lines, offset = meta.pop(out)
                first_line += lines
                yield texts, lines, tokens, (first_line - 1, offset)
                out += 1


def _read_ahead(chunks: Iterator, size: int) -> "queue.Queue":
    """The chunks, read on a thread into a queue of at most ``size`` (then None; or the
    exception that reading raised)."""
    import threading

    feed: queue.Queue = queue.Queue(maxsize=size)

    def read() -> None:
        try:
            for item in chunks:
                feed.put(item)
            feed.put(None)
        except BaseException as e:  # noqa: BLE001 - raised again on the main thread
            feed.put(e)

    threading.Thread(target=read, name="nmt-generate-input", daemon=True).start()
    return feed


def worker_threads(threads: int | None, workers: int) -> int:
    """Each worker's share of --threads (default: this machine's cores), at least 1."""
    return thread_share(threads or os.cpu_count() or 1, workers)


__all__ = ["WorkerPool", "WorkerSpec", "worker_threads"]
