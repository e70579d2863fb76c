"""The text side of translation, whatever engine decodes: results, source checks, batches and
input order (importable without torch).

``TranslatorBase`` holds what every engine shares: raw sentences are encoded with the
checkpoint's codec, checked against the source vocabulary, cut to what the model accepts (a
warning names the line), sorted by length (longest first) and batched by ``BatchConfig``; empty
sources get an empty translation without a model call; results come back in input order. An
engine supplies ``_decode_batch`` (sources in, hypotheses out): nmt's own PyTorch decoder
(nmt.search.translator.Translator) or CTranslate2 (nmt.engines.ctranslate2).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Callable, Sequence, overload

import numpy as np

from nmt.data.buckets import longest_first
from nmt.errors import NmtError
from nmt.search.config import BatchConfig, SearchConfig

log = logging.getLogger("nmt.search")


@dataclass
class TranslationHypothesis:
    text: str                     # detokenized translation
    ids: list[int]                # target ids, ending with eos
    tokens: list[str]             # their subword symbols
    score: float | None           # log P / lp(|Y|); None where not asked for (scores=False)
    # log-prob of each token; None where the engine does not give them (CTranslate2)
    token_scores: list[float] | None


@dataclass
class Translation:
    index: int                    # 0-based position in the input
    source: str
    hypotheses: list[TranslationHypothesis] = field(default_factory=list)  # best first
    truncated: bool = False       # the source was cut to the model's maximum length

    @property
    def text(self) -> str:
        return self.hypotheses[0].text if self.hypotheses else ""

    def to_json(self) -> dict:
        best = self.hypotheses[0] if self.hypotheses else None
        out = {"id": self.index, "source": self.source, "translation": self.text,
               "score": None if best is None else round_score(best.score),
               "tokens": [] if best is None else best.tokens,
               "token_scores": [] if best is None else _rounded(best.token_scores)}
        if self.truncated:
            out["truncated"] = True
        if len(self.hypotheses) > 1:
            out["nbest"] = [{"translation": h.text, "score": round_score(h.score),
                             "tokens": h.tokens, "token_scores": _rounded(h.token_scores)}
                            for h in self.hypotheses]
        return out


def round_score(score: float | None) -> float | None:
    """A score as nmt's outputs write it (6 decimals; None stays None)."""
    return None if score is None else round(score, 6)


def _rounded(scores: list[float] | None) -> list[float] | None:
    return None if scores is None else [round(s, 6) for s in scores]


class TranslatorBase:
    """Raw sentences in, translations out, in input order; subclasses decode.

    Attributes every engine sets: ``search`` (a resolved SearchConfig), ``batch``
    (BatchConfig) and ``batch_size`` / ``max_tokens`` (its limits at this beam),
    ``src_codec`` / ``tgt_codec``, ``task``, ``constraints`` (the task's decoding constraints,
    None for none), ``sampling`` (None: beam search), ``max_source_len`` (subwords, eos
    excluded), ``max_positions`` (the decoder's, None: unbounded), ``device`` and
    ``precision``.
    """

    engine = "nmt"
    precision = "fp32"
    sampling = None
    constraints = None
    align_layer: int | None = None

    search: SearchConfig
    batch: BatchConfig

    def _set_limits(self, max_positions: int | None, width: int | None = None) -> None:
        """batch_size/max_tokens and max_source_len, once search and batch are set; ``width``:
        the decoder's layers x d_model (BatchConfig.limits), None: unknown."""
        self.batch_size, self.max_tokens = self.batch.limits(self.search.beam, width)
        # The encoder reads ids + eos, so learned positions leave max_positions - 1 for ids.
        self.max_source_len = (self.batch.max_source_len if max_positions is None
                               else min(self.batch.max_source_len, max_positions - 1))

    @property
    def max_positions(self) -> int | None:
        raise NotImplementedError

    def describe(self) -> str:
        """The engine in a few words, for a log line: "1 model(s) on cpu, fp32"."""
        raise NotImplementedError

    def check_search(self, search: SearchConfig) -> None:
        """UsageError when this engine cannot decode exactly as ``search`` says (every
        engine but nmt's own refuses some options)."""

    # --- translation ------------------------------------------------------------------------
    @overload
    def translate(self, lines: str) -> str: ...

    @overload
    def translate(self, lines: Sequence[str]) -> list[str]: ...

    def translate(self, lines):
        """The best translation of each line, in order (empty line -> empty string); a single
        string gives a single string."""
        if isinstance(lines, str):
            return self.translate_results([lines], scores=False)[0].text
        return [t.text for t in self.translate_results(lines, scores=False)]

    def translate_results(self, lines: Sequence[str], progress: Callable[[int], None] | None = None,
                          first_line: int = 1,
                          prefixes: Sequence[str | None] | None = None,
                          constraints: Sequence[Sequence[str] | None] | None = None,
                          scores: bool = True) -> list[Translation]:
        """Rich results (scores, tokens, n-best) for raw sentences, in input order.

        ``progress(n)`` is called after each batch with the number of sentences it finished;
        ``first_line`` is the 1-based line number of ``lines[0]`` in the whole input (for
        warnings and each result's ``index``, ``first_line - 1`` for it). ``prefixes`` (one per
        line, None or "" for none): raw target text each translation must start with; it is
        encoded with the target codec and beam search continues after it. ``constraints`` (one
        list per line, None or [] for none): raw target phrases each translation must contain
        (nmt.search.lexical), each encoded with the target codec; one it cannot spell is a
        one-line NmtError naming its line. ``scores=False``: the caller needs no scores, and an
        engine may leave them out (None) where that saves work (CTranslate2's greedy search);
        the translations are the same.
        """
        if isinstance(lines, (str, bytes)):
            raise TypeError("translate_results takes a list of sentences, not one string; "
                            "wrap it: translate_results([sentence])")
        lines = list(lines)
        bad = next((i for i, x in enumerate(lines) if not isinstance(x, str)), None)
        if bad is not None:
            raise TypeError(f"sentence {bad} is {type(lines[bad]).__name__}, not str")
        self.check_targets(prefixes, constraints)
        ids = self.src_codec.encode_batch(lines) if lines else []
        prefix_ids = None
        if prefixes is not None:
            if len(prefixes) != len(lines):
                raise ValueError(f"{len(prefixes)} prefixes for {len(lines)} sentences")
            from nmt.search.prefix import encode_prefixes

            prefix_ids = encode_prefixes(self.tgt_codec, prefixes, first_line)
        constraint_ids = None
        if constraints is not None:
            from nmt.search.lexical import encode_constraints

            if len(constraints) != len(lines) or any(isinstance(c, str) for c in constraints):
                raise ValueError(f"constraints takes one list of phrases per sentence (None "
                                 f"for none), got {len(constraints)} entries for "
                                 f"{len(lines)} sentences")
            constraint_ids = [encode_constraints(self.tgt_codec, c, f"line {first_line + i}")
                              for i, c in enumerate(constraints)]
        return self.translate_ids(ids, sources=lines, progress=progress, first_line=first_line,
                                  prefixes=prefix_ids, constraints=constraint_ids,
                                  scores=scores)

    def translate_ids(self, ids: Sequence[Sequence[int] | np.ndarray],
                      sources: Sequence[str] | None = None,
                      progress: Callable[[int], None] | None = None,
                      first_line: int = 1,
                      prefixes: Sequence[Sequence[int]] | None = None,
                      constraints: Sequence[Sequence[Sequence[int]]] | None = None,
                      scores: bool = True,
                      lines: Sequence[int] | None = None) -> list[Translation]:
        """Translate already-encoded sources (ids without eos), e.g. a binarized test split;
        ``prefixes``: target ids (without eos) each translation starts with (see
        nmt.search.prefix); ``constraints``: per source, the target ids (without eos) of each
        phrase its translation must contain (nmt.search.lexical); ``scores`` as
        :meth:`translate_results` takes it. ``lines``: each source's own 1-based line number
        (default ``first_line + i``), which messages name, sampling seeds draw from and each
        result's ``index`` is (less 1): a caller that gathers sentences of several inputs into
        one call (nmt-serve) gives each the number it has in its own input."""
        n = len(ids)
        if sources is None:
            sources = [self.src_codec.decode(x) for x in ids]
        if lines is None:
            lines = range(first_line, first_line + n)
        elif len(lines) != n:
            raise ValueError(f"{len(lines)} line numbers for {n} sources")
        # The index is the 0-based line of the whole input ("id" in jsonl output), not of this
        # call's chunk: a command translating a stream chunk by chunk passes ``first_line``;
        # a caller gathering several inputs (nmt-serve) passes each source's own ``lines``.
        results = [Translation(lines[i] - 1, sources[i]) for i in range(n)]
        arrays: list[np.ndarray] = []
        for i, x in enumerate(ids):
            a, results[i].truncated = self.source_array(x, lines[i])
            arrays.append(a)
        if constraints is not None and not any(len(c) for c in constraints):
            constraints = None
        if prefixes is not None and not any(len(p) for p in prefixes):
            prefixes = None
        if constraints is not None or prefixes is not None:
            self.check_targets(prefixes, constraints)
            self._check_room(arrays, constraints, prefixes, lines)
        empty = [i for i in range(n) if arrays[i].size == 0]
        if progress is not None and empty:
            progress(len(empty))
        args = (arrays, lines, prefixes, constraints, scores)
        for batch, hyps in self._decoded(self._batches(arrays), args):
            for i, sent_hyps in zip(batch, hyps):
                results[i].hypotheses = [self._hypothesis(h) for h in sent_hyps]
            if progress is not None:
                progress(len(batch))
        self._finish(results, arrays)
        return results

    def source_array(self, ids: Sequence[int] | np.ndarray, line: int) -> tuple[np.ndarray, bool]:
        """Source ids (without eos) as an int64 array checked against the source vocabulary
        and cut to what the model accepts (with a warning naming ``line``); and whether it
        was cut."""
        a = np.asarray(ids, dtype=np.int64).reshape(-1)
        vocab = len(self.src_codec.dictionary)
        if a.size and (int(a.min()) < 0 or int(a.max()) >= vocab):
            raise NmtError(f"line {line}: source id outside the vocabulary (0..{vocab - 1})")
        if a.size <= self.max_source_len:
            return a, False
        log.warning("line %d: source has %d subwords, more than the %d the model accepts; "
                    "truncated", line, a.size, self.max_source_len)
        return a[:self.max_source_len], True

    # --- what an engine supplies ------------------------------------------------------------
    def _decode_batch(self, batch: list[int], arrays: list[np.ndarray], lines: Sequence[int],
                      prefixes: Sequence[Sequence[int]] | None,
                      constraints: Sequence[Sequence[Sequence[int]]] | None,
                      scores: bool = True) -> list[list]:
        """Per source ``arrays[i]`` of ``batch`` (indices, each source non-empty; ``lines[i]``
        its line number), its hypotheses best first: objects with ``tokens`` (ids ending with
        eos), ``score`` (may be None when ``scores`` is False) and ``token_scores`` (None: not
        known)."""
        raise NotImplementedError

    def check_targets(self, prefixes, constraints) -> None:
        """UsageError when this engine cannot force prefixes or constraints given."""

    def _check_room(self, arrays: list[np.ndarray], constraints, prefixes,
                    lines: Sequence[int]) -> None:
        """Before anything is decoded: each line's forced targets fit its length limit."""

    def _finish(self, results: list[Translation], arrays: list[np.ndarray]) -> None:
        """After every batch: what works on the whole results (nmt: --replace-unk)."""

    def _parallel(self) -> int:
        """Batches this engine decodes at once (BatchConfig.parallel resolved; 1: one at a
        time, in the calling thread)."""
        return 1

    def _threads_shared(self, n: int) -> AbstractContextManager:
        """While ``n`` batches decode at once: the engine's threads shared among them."""
        return nullcontext()

    def _decoded(self, batches: list[list[int]], args: tuple):
        """(batch, its hypotheses) for every batch, in the order they finish: one at a time,
        or ``_parallel()`` at once on as many threads (the batches then number at least that
        many: the largest are halved until they do). Each batch is decoded whole by one
        thread, so its translations do not depend on which thread or when."""
        n = self._parallel()
        if n > 1:
            batches = split_for_threads(batches, n)
        if n <= 1 or len(batches) <= 1:
            for batch in batches:
                yield batch, self._decode_batch(batch, *args)
            return
        with self._threads_shared(n), ThreadPoolExecutor(n, "nmt-batch") as pool:
            futures = {pool.submit(self._decode_batch, b, *args): b for b in batches}
            try:
                for done in as_completed(futures):
                    yield futures[done], done.result()
            finally:
                for f in futures:
                    f.cancel()

    def _hypothesis(self, h) -> TranslationHypothesis:
        d = self.tgt_codec.dictionary
        return TranslationHypothesis(text=self.tgt_codec.decode(h.tokens), ids=h.tokens,
                                     tokens=[d[i] for i in h.tokens], score=h.score,
                                     token_scores=h.token_scores)

    def _batches(self, arrays: list[np.ndarray]) -> list[list[int]]:
        """Non-empty sources, longest first (stable), cut into batches."""
        return longest_first([a.size + 1 for a in arrays], self.max_tokens, self.batch_size,
                             among=(i for i, a in enumerate(arrays) if a.size))


def split_for_threads(batches: list[list[int]], n: int) -> list[list[int]]:
    """At least ``n`` batches where the sentences allow: the largest batch is cut in two
    (its first half first, keeping the longest-first order) until there are ``n``."""
    batches = list(batches)
    while len(batches) < n:
        j = max(range(len(batches)), key=lambda i: len(batches[i]), default=None)
        if j is None or len(batches[j]) < 2:
            break
        b = batches[j]
        batches[j:j + 1] = [b[:len(b) // 2], b[len(b) // 2:]]
    return batches


__all__ = ["TranslatorBase", "Translation", "TranslationHypothesis", "split_for_threads",
           "round_score"]
