"""Dynamic batching: one decoding thread per model gathers the sentences of concurrent requests
into batches.

A request's sentences (already encoded) and its decoding options (a resolved SearchConfig)
wait in one queue, oldest first, of at most ``max_queued`` sentences (a request that would
pass it is refused: QueueFull). Requests take turns: each batch is led by the request served
longest ago (one never served first, then in arrival order), so a request of many long
sentences cannot hold the others back for more than a batch at a time. The worker takes the
leading request's options and gathers its waiting sentences, then, in arrival order, the
other waiting sentences with equal options, until the next one would take the
batch past ``max_tokens`` source tokens (the longest source + eos, times the sentences:
padding included, as the Translator counts) or past ``max_search_tokens`` search steps (the
sentences times the beam times the longest length limit + 1: the decoder's cache and work,
which a request's max_len and min_len would otherwise make as large as it likes), or until
the leader has waited ``max_wait`` seconds, then decodes them with
``Translator.translate_ids``. Sentences that arrive while a
batch decodes are waiting already when it ends, so a busy server batches without waiting.
Whatever a batch holds, each sentence gets the translation it gets alone: beam search is
batch-invariant (tests/test_translator.py), sampling draws from (seed, the sentence's position
in its own request), and options never mix.

A request's result is a ``concurrent.futures.Future`` (the HTTP side awaits it with
``asyncio.wrap_future``), set once all its sentences are decoded, possibly across batches.
Cancelling it (the client left, or its time ran out) drops its sentences still waiting.
``stop()`` refuses new work, decodes (or drops) what is waiting, and ends the thread. Should the worker
itself fail outside a batch, every waiting request gets the error, and so does every later
one (``broken``; /ready then answers 503).
"""

from __future__ import annotations

import copy
import itertools
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from nmt.search.config import SamplingConfig, SearchConfig, length_limit

log = logging.getLogger("nmt.serve")


class Stopping(Exception):
    """The batcher is stopping (or has failed) and takes no new work."""


class QueueFull(Exception):
    """The batcher's queue holds as many sentences as it may: try again later."""


@dataclass
class _Job:
    """One request: its options, its sentences' results so far, and the future to set."""
    search: SearchConfig
    sources: Sequence[str]
    results: list = field(default_factory=list)
    left: int = 0
    future: Future = field(default_factory=Future)
    turn: int = -1             # the number of the last batch it led or joined (-1: none yet)
    sampling: SamplingConfig | None = None     # None: beam search

    @property
    def options(self) -> tuple:
        """What decodes its sentences: only jobs with equal options share a batch."""
        return self.search, self.sampling


@dataclass
class _Item:
    """One sentence of a job, waiting."""
    job: _Job
    index: int                 # position in its request
    ids: np.ndarray            # source ids, without eos
    prefix: Sequence[int]      # forced target prefix ids (empty: none)
    constraints: Sequence      # lexical constraints' target ids (empty: none)
    arrival: float
    steps: int                 # its length limit + 1 (the eos): the search's steps at most


class Batcher:
    """Decodes the sentences submitted to one Translator in dynamic batches, on one thread."""

    def __init__(self, translator, name: str, max_tokens: int, max_wait: float,
                 max_search_tokens: int = 65536, max_queued: int = 16384):
        self.translator, self.name = translator, name
        self.max_tokens, self.max_wait = max_tokens, max_wait
        self.max_search_tokens, self.max_queued = max_search_tokens, max_queued
        self._pending: deque[_Item] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._cancelled = False        # a queued request's future was cancelled: purge it
        self._batches = 0
        self.broken: BaseException | None = None     # why the worker ended, if it failed
        self._thread = threading.Thread(target=self._run, name=f"nmt-serve-{name}", daemon=True)

    def start(self) -> "Batcher":
        self._thread.start()
        return self

    def submit(self, search: SearchConfig, ids: Sequence[np.ndarray], sources: Sequence[str],
               prefixes: Sequence[Sequence[int]] | None = None,
               constraints: Sequence[Sequence[Sequence[int]]] | None = None,
               sampling: SamplingConfig | None = None) -> Future:
        """Queue one request's encoded sentences; the future gives its Translations in order.
        ``search`` must be resolved (every field set); ``prefixes`` and ``constraints``: per
        sentence, as Translator.translate_ids takes them; ``sampling``: draw instead of beam
        search, each sentence seeded by its position in the request (from 1)."""
        job = _Job(search, sources, [None] * len(ids), len(ids), sampling=sampling)
        if not ids:
            job.future.set_result([])
            return job.future
        steps = step_limits(ids, search, self.translator.max_positions)
        now = time.monotonic()
        with self._cond:
            if self.broken is not None:
                raise Stopping(f"model '{self.name}' cannot decode: its decoding thread failed "
                               f"({type(self.broken).__name__}: {self.broken})")
            if self._stopping:
                raise Stopping(f"model '{self.name}' is shutting down")
            if len(self._pending) + len(ids) > self.max_queued:
                raise QueueFull(f"model '{self.name}' has {len(self._pending)} sentences "
                                f"waiting; this server queues at most {self.max_queued} "
                                f"(--max-queued-sentences): try again later")
            for i, x in enumerate(ids):
                self._pending.append(_Item(job, i, x, prefixes[i] if prefixes else (),
                                           constraints[i] if constraints else (), now,
                                           steps[i]))
            self._cond.notify()
        job.future.add_done_callback(self._on_done)
        log.debug("model '%s': %d sentences queued", self.name, len(ids))
        return job.future

    def _on_done(self, future: Future) -> None:
        if future.cancelled():
            with self._cond:
                self._cancelled = True
                self._cond.notify()

    def stop(self, timeout: float | None = None, drop: bool = False) -> None:
        """Take no more work, finish what is waiting (``drop``: fail it with Stopping instead),
        end the thread, waiting for it at most ``timeout`` seconds."""
        with self._cond:
            self._stopping = True
            if drop:
                waiting, self._pending = self._pending, deque()
            self._cond.notify()
        if drop:
            error = Stopping(f"model '{self.name}' is shutting down")
            for job in {id(it.job): it.job for it in waiting}.values():
                _settle(job.future, error=error)
        if self._thread.is_alive():
            self._thread.join(timeout)

    # --- the worker -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                items = self._next_batch()
                if items is None:
                    return
                try:
                    self._decode(items)
                except BaseException as e:  # noqa: BLE001 - the thread outlives any one batch
                    log.error("model '%s': a batch ended in an error outside decoding: %s: %s",
                              self.name, type(e).__name__, e)
                    for job in {id(it.job): it.job for it in items}.values():
                        _settle(job.future, error=e)
        except BaseException as e:  # noqa: BLE001 - no request may wait for a dead thread
            log.error("model '%s': the decoding thread failed: %s: %s", self.name,
                      type(e).__name__, e)
            with self._cond:
                self.broken = e
                waiting, self._pending = self._pending, deque()
            for job in {id(it.job): it.job for it in waiting}.values():
                _settle(job.future, error=e)

    def _next_batch(self) -> list[_Item] | None:
        """The next batch to decode (waiting for it to fill or time out); None when stopped
        and drained."""
        with self._cond:
            while True:
                if self._cancelled:
                    self._purge()
                if not self._pending:
                    if self._stopping:
                        return None
                    self._cond.wait()
                    continue
                lead = self._leader()
                chosen, full = self._gather(lead.job)
                wait = lead.arrival + self.max_wait - time.monotonic()
                if full or wait <= 0 or self._stopping:
                    taken = set(map(id, chosen))
                    self._pending = deque(x for x in self._pending if id(x) not in taken)
                    self._batches += 1
                    for item in chosen:
                        item.job.turn = self._batches
                    return chosen
                self._cond.wait(wait)

    def _purge(self) -> None:
        """Drop the waiting sentences of cancelled requests (their clients are gone)."""
        self._cancelled = False
        before = len(self._pending)
        self._pending = deque(x for x in self._pending if not x.job.future.done())
        if len(self._pending) < before:
            log.debug("model '%s': %d sentences of cancelled requests dropped", self.name,
                      before - len(self._pending))

    def _leader(self) -> _Item:
        """The first waiting sentence of the request served longest ago (never: first)."""
        lead = self._pending[0]
        if lead.job.turn < 0:
            return lead
        for item in self._pending:
            if item.job.turn < lead.job.turn:
                lead = item
                if lead.job.turn < 0:
                    break
        return lead

    def _gather(self, job: _Job) -> tuple[list[_Item], bool]:
        """The waiting sentences with the options of ``job``, its own first, then the others
        oldest first, that fit in one batch (always at least one); and whether the batch is
        full."""
        search, options = job.search, job.options
        chosen: list[_Item] = []
        width = steps = 0                # longest source in the batch with eos; most steps
        # lazily: the loop stops at the first sentence that would not fit
        ordered = itertools.chain((x for x in self._pending if x.job is job),
                                  (x for x in self._pending if x.job is not job))
        for item in ordered:
            if item.job.options != options:
                continue
            w, t = max(width, item.ids.size + 1), max(steps, item.steps)
            n = len(chosen) + 1
            if chosen and (w * n > self.max_tokens
                           or n * search.beam * t > self.max_search_tokens):
                return chosen, True
            chosen.append(item)
            width, steps = w, t
        return chosen, (width * len(chosen) >= self.max_tokens
                        or len(chosen) * search.beam * steps >= self.max_search_tokens)

    def _decode(self, items: list[_Item]) -> None:
        # the sentences of a request that failed in an earlier batch are not decoded
        items = [it for it in items if not it.job.future.done()]
        if not items:
            return
        start = time.perf_counter()
        # shares the models; only the options differ
        translator = copy.copy(self.translator)
        translator.search = items[0].job.search
        translator.sampling = items[0].job.sampling
        prefixes = [it.prefix for it in items] if any(len(it.prefix) for it in items) else None
        constraints = ([it.constraints for it in items]
                       if any(len(it.constraints) for it in items) else None)
        try:
            results = translator.translate_ids([it.ids for it in items],
                                               sources=[it.job.sources[it.index] for it in items],
                                               prefixes=prefixes, constraints=constraints,
                                               # each sentence's line in its own request
                                               lines=[it.index + 1 for it in items],
                                               # replies hold the texts, and with n-best
                                               # lists their scores
                                               scores=translator.search.nbest > 1)
        except Exception as e:  # noqa: BLE001 - the requests get the error, the worker goes on
            jobs = {id(it.job): it.job for it in items}
            log.error("model '%s': a batch of %d sentences from %d requests failed: %s: %s",
                      self.name, len(items), len(jobs), type(e).__name__,
                      " ".join(str(e).split()))
            if len(jobs) == 1:
                _settle(next(iter(jobs.values())).future, error=e)
                return
            # One request must not fail the others it shared the batch with: each is decoded
            # again alone, and only the one that fails alone gets the error.
            for key in jobs:
                self._decode([it for it in items if id(it.job) == key])
            return
        # logged before any reply goes out, so that a client that has its reply finds the line
        log.debug("model '%s': %d sentences from %d requests in %.1f ms", self.name, len(items),
                  len({id(it.job) for it in items}), 1000 * (time.perf_counter() - start))
        for it, result in zip(items, results):
            job = it.job
            job.results[it.index] = result      # (its .index is it.index: lines= gave it)
            job.left -= 1
            if job.left == 0:
                _settle(job.future, result=job.results)


def step_limits(ids: Sequence[np.ndarray], search: SearchConfig,
                max_positions: int | None) -> list[int]:
    """Each sentence's search steps at most: its length limit + 1 (the eos)."""
    return [length_limit(x.size, search, max_positions) + 1 for x in ids]


def _settle(future: Future, result=None, error: BaseException | None = None) -> None:
    """Set ``future``'s result or error unless it is done already (e.g. cancelled)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass


__all__ = ["Batcher", "Stopping", "QueueFull", "step_limits"]
