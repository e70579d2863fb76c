"""Translator: raw sentences in, translations out, in input order (the API nmt-generate uses).

    from nmt import Translator
    from nmt.search.translator import BatchConfig, SearchConfig
    t = Translator.from_checkpoint("checkpoint_best.pt", search=SearchConfig(beam=5, nbest=2),
                                   batch=BatchConfig(max_tokens=4096), device="auto")
    t.translate(["A man is riding a bike .", ""])          # -> ["Ein Mann ...", ""]
    t.translate_results(lines)                             # scores, tokens, n-best lists

Decoding (``SearchConfig``): fields left None come from the checkpoint's preset. Sentences are
encoded with the checkpoint's own codec, sorted by length (longest first) and batched
(``BatchConfig``) by ``batch_size`` sentences and/or ``max_tokens`` source tokens (padding
included); the results are put back in input order. An empty line (no subwords) gives an
empty translation without a model call. A source longer than the model accepts
(``max_source_len`` subwords, at most max_positions - 1 for learned positions, the eos taking
the last one) is truncated with a warning naming its line number.

``load_split`` reads the sources of the split of the data directory a checkpoint was trained
on (nmt-generate's pipeline mode); nmt-generate's options are ``nmt.search.config``'s
``GenerateConfig``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, overload

import numpy as np
import torch

from nmt.data.batching import longest_first
from nmt.errors import NmtError, UsageError
from nmt.runtime import QUANTIZED_PRECISIONS, auto_precision, check_precision, resolve_device
from nmt.search.config import DEFAULT_SEARCH_TOKENS, BatchConfig, SamplingConfig, SearchConfig
from nmt.search.ensemble import EnsembleModel
from nmt.search.generator import EOS, PAD, beam_search
from nmt.tasks.task import Task, get_task, infer_task

log = logging.getLogger("nmt.search")

@dataclass
class TranslationHypothesis:
    text: str                     # detokenized translation
    ids: list[int]                # target ids, ending with eos
    tokens: list[str]             # their subword symbols
    score: float                  # log P / lp(|Y|)
    token_scores: list[float]     # log-prob of each token


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
               "score": None if best is None else round(best.score, 6),
               "tokens": [] if best is None else best.tokens,
               "token_scores": [] if best is None else [round(s, 6) for s in best.token_scores]}
        if self.truncated:
            out["truncated"] = True
        if len(self.hypotheses) > 1:
            out["nbest"] = [{"translation": h.text, "score": round(h.score, 6),
                             "tokens": h.tokens,
                             "token_scores": [round(s, 6) for s in h.token_scores]}
                            for h in self.hypotheses]
        return out


def _warn_other_preset(cfg, first, search: SearchConfig | None, name, first_name) -> None:
    """An ensemble decodes with the first checkpoint's preset (its beam, length penalty and
    limits): say so when another member's preset differs in a field the command line did not
    set, since the order of the checkpoints then changes the output."""
    from nmt.search.config import PRESET_FIELDS

    given = search or SearchConfig()
    differ = [f"{k} {getattr(cfg, k, None)!r} (uses {getattr(first, k, None)!r})"
              for k in PRESET_FIELDS
              if getattr(given, k) is None and getattr(cfg, k, None) != getattr(first, k, None)]
    if differ:
        log.warning("%s decodes with the preset of %s, the first checkpoint, not its own: "
                    "%s; give the options to choose", name, first_name, "; ".join(differ))


class Translator:
    """Beam search translation with one model or an ensemble, plus the text pipeline."""

    precision = "fp32"      # what from_checkpoint loaded the models in (auto: what it chose)

    def __init__(self, models: Sequence[torch.nn.Module], src_codec, tgt_codec, *,
                 search: SearchConfig | None = None, batch: BatchConfig | None = None,
                 device: str | torch.device | None = "cpu",
                 sampling: SamplingConfig | None = None, tree_constraints: bool | None = None,
                 task: Task | str | None = None):
        """``models`` are on ``device`` already, in eval mode. Unset ``search`` fields come from
        the first model's preset (its ``cfg``; the paper's defaults for a model without one).
        ``sampling``: draw ``search.nbest`` samples per sentence instead of beam search.
        ``task`` (nmt.tasks.task; a name or a Task): what the model is for, which gives the
        decoding constraints; None: inferred from the target vocabulary (a checkpoint records
        it: from_checkpoint passes it). ``tree_constraints``: well-formed linearized trees by
        construction (nmt.search.constraints) forced on or off; None: the task's default (on
        for parsing)."""
        self.ensemble = EnsembleModel(models)
        self.search = (search or SearchConfig()).resolve(getattr(models[0], "cfg", None))
        self.batch = batch or BatchConfig()
        self.batch_size, self.max_tokens = self.batch.limits(self.search.beam)
        self.device = resolve_device("cpu" if device is None else device)
        self.src_codec, self.tgt_codec = src_codec, tgt_codec
        self.task = (get_task(task) if isinstance(task, str)
                     else task or infer_task(tgt_codec.dictionary))
        self.constraints = self.task.constraints(tgt_codec.dictionary, src_codec.dictionary,
                                                 tree_constraints)
        self.sampling = sampling
        # The decoder layer whose attention --replace-unk follows (nmt.search.forced.align;
        # None: the penultimate).
        self.align_layer: int | None = None
        limit = self.ensemble.max_positions
        # The encoder reads ids + eos, so learned positions leave max_positions - 1 for ids.
        self.max_source_len = (self.batch.max_source_len if limit is None
                               else min(self.batch.max_source_len, limit - 1))

    # --- construction -----------------------------------------------------------------------
    @classmethod
    def from_checkpoint(cls, paths: str | os.PathLike | dict | Sequence[str | os.PathLike | dict],
                        *, search: SearchConfig | None = None, batch: BatchConfig | None = None,
                        device: str | torch.device | None = None,
                        precision: str = "fp32", sampling: SamplingConfig | None = None,
                        tree_constraints: bool | None = None) -> "Translator":
        """Load one checkpoint or an ensemble (a list of paths sharing their vocabularies).

        Each entry is a path or a checkpoint dict already read with
        nmt.checkpoint.load_checkpoint.

        ``search`` fields left None come from the (first) checkpoint's architecture preset.
        ``device``: cpu, cuda, cuda:N or auto/None (nmt.runtime.resolve_device).
        ``precision`` fp16 needs a GPU; bf16 a GPU or a CPU with native bf16 support; int8
        (the linear layers dynamically quantized, nmt.models.quantize) runs on the CPU only,
        which device auto/None then means. ``sampling`` and ``tree_constraints``: as for the
        constructor.
        """
        from nmt.checkpoint import (checkpoint_task, codecs_from_checkpoint,
                                    load_model_from_checkpoint, model_config)

        if isinstance(paths, (str, os.PathLike, dict)):
            paths = [paths]
        if not paths:
            raise UsageError("no checkpoint given")
        if precision in QUANTIZED_PRECISIONS and (device is None or str(device) == "auto"):
            device = "cpu"
        dev = resolve_device(device)
        dtype = None if precision == "auto" else check_precision(precision, dev)
        models, codecs, cfg, task = [], None, None, None
        names = [p if not isinstance(p, dict) else f"checkpoint {i + 1}"
                 for i, p in enumerate(paths)]
        for p, name in zip(paths, names):
            model, ckpt = load_model_from_checkpoint(p, device=dev)
            if dtype is None:           # --precision auto: the first model decides
                precision, why = auto_precision(dev, model.cfg.d_model)
                dtype = check_precision(precision, dev)
                log.info("precision auto: %s (%s)", precision, why)
            src, tgt = codecs_from_checkpoint(ckpt, str(name))
            if codecs is None:
                codecs, cfg = (src, tgt), model_config(ckpt)
                task = checkpoint_task(ckpt, str(name), tgt)
            elif not (src.same_as(codecs[0]) and tgt.same_as(codecs[1])):
                raise UsageError(f"{name}: cannot ensemble checkpoints with different "
                                 f"vocabularies or subword models (compare with {names[0]})")
            else:
                _warn_other_preset(model_config(ckpt), cfg, search, name, names[0])
            model = model.to(dtype).eval()
            if precision in QUANTIZED_PRECISIONS:
                from nmt.models.quantize import quantize_int8

                model = quantize_int8(model)
            else:
                from nmt.models.packed import pack_linears

                pack_linears(model)         # on a CPU: weights packed once for oneDNN
            models.append(model)
        translator = cls(models, codecs[0], codecs[1],
                         search=(search or SearchConfig()).resolve(cfg), batch=batch, device=dev,
                         sampling=sampling, tree_constraints=tree_constraints, task=task)
        translator.precision = precision
        return translator

    # --- translation ------------------------------------------------------------------------
    @overload
    def translate(self, lines: str) -> str: ...

    @overload
    def translate(self, lines: Sequence[str]) -> list[str]: ...

    def translate(self, lines):
        """The best translation of each line, in order (empty line -> empty string); a single
        string gives a single string."""
        if isinstance(lines, str):
            return self.translate_results([lines])[0].text
        return [t.text for t in self.translate_results(lines)]

    def translate_results(self, lines: Sequence[str], progress: Callable[[int], None] | None = None,
                          first_line: int = 1,
                          prefixes: Sequence[str | None] | None = None,
                          constraints: Sequence[Sequence[str] | None] | None = None
                          ) -> list[Translation]:
        """Rich results (scores, tokens, n-best) for raw sentences, in input order.

        ``progress(n)`` is called after each batch with the number of sentences it finished;
        ``first_line`` is the 1-based line number of ``lines[0]`` in the whole input (for
        warnings and each result's ``index``, ``first_line - 1`` for it). ``prefixes`` (one per
        line, None or "" for none): raw target text each translation must start with; it is
        encoded with the target codec and beam search continues after it. ``constraints`` (one
        list per line, None or [] for none): raw target phrases each translation must contain
        (nmt.search.lexical), each encoded with the target codec; one it cannot spell is a
        one-line NmtError naming its line.
        """
        if isinstance(lines, (str, bytes)):
            raise TypeError("translate_results takes a list of sentences, not one string; "
                            "wrap it: translate_results([sentence])")
        lines = list(lines)
        bad = next((i for i, x in enumerate(lines) if not isinstance(x, str)), None)
        if bad is not None:
            raise TypeError(f"sentence {bad} is {type(lines[bad]).__name__}, not str")
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
                                  prefixes=prefix_ids, constraints=constraint_ids)

    def translate_ids(self, ids: Sequence[Sequence[int] | np.ndarray],
                      sources: Sequence[str] | None = None,
                      progress: Callable[[int], None] | None = None,
                      first_line: int = 1,
                      prefixes: Sequence[Sequence[int]] | None = None,
                      constraints: Sequence[Sequence[Sequence[int]]] | None = None
                      ) -> list[Translation]:
        """Translate already-encoded sources (ids without eos), e.g. a binarized test split;
        ``prefixes``: target ids (without eos) each translation starts with (see
        nmt.search.prefix); ``constraints``: per source, the target ids (without eos) of each
        phrase its translation must contain (nmt.search.lexical)."""
        n = len(ids)
        if sources is None:
            sources = [self.src_codec.decode(x) for x in ids]
        # The index is the 0-based line of the whole input ("id" in jsonl output), not of this
        # call's chunk: a command translating a stream chunk by chunk passes ``first_line``.
        results = [Translation(first_line - 1 + i, sources[i]) for i in range(n)]
        arrays: list[np.ndarray] = []
        for i, x in enumerate(ids):
            a, results[i].truncated = self.source_array(x, first_line + i)
            arrays.append(a)
        if constraints is not None and not any(len(c) for c in constraints):
            constraints = None
        if prefixes is not None and not any(len(p) for p in prefixes):
            prefixes = None
        if constraints is not None or prefixes is not None:
            self._check_room(arrays, constraints, prefixes, first_line)
        empty = [i for i in range(n) if arrays[i].size == 0]
        if progress is not None and empty:
            progress(len(empty))
        for batch in self._batches(arrays):
            src = self._collate([arrays[i] for i in batch])
            cons = self._constraints(batch, prefixes, constraints)
            if self.sampling is not None:
                from nmt.search.sampling import sample

                hyps = sample(self.ensemble, src, self.search, self.sampling,
                              [first_line + i for i in batch], constraints=cons)
            else:
                hyps = beam_search(self.ensemble, src, self.search, constraints=cons)
            for i, sent_hyps in zip(batch, hyps):
                results[i].hypotheses = [self._hypothesis(h) for h in sent_hyps]
            if progress is not None:
                progress(len(batch))
        if self.search.replace_unk:
            from nmt.search.replace_unk import replace_unknowns

            replace_unknowns(self, results, arrays, self.align_layer)
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

    def _check_room(self, arrays: list[np.ndarray], constraints, prefixes,
                    first_line: int) -> None:
        """Before anything is decoded: lexical constraints go with this decoding, and each
        line's forced prefix and constraints fit in its length limit (one-line errors)."""
        from nmt.search.lexical import check_room, refuse_with

        for name, given in (("constraint lists", constraints), ("prefixes", prefixes)):
            if given is not None and len(given) != len(arrays):
                raise ValueError(f"{len(given)} {name} for {len(arrays)} sources")
        if constraints is not None:
            refuse_with(self.search, self.sampling is not None, self.constraints is not None)
        for i, a in enumerate(arrays):
            check_room(constraints[i] if constraints else (), len(prefixes[i]) if prefixes
                       else 0, a.size, self.search, self.ensemble.max_positions,
                       f"line {first_line + i}")

    def _constraints(self, batch: list[int], prefixes: Sequence[Sequence[int]] | None,
                     constraints: Sequence[Sequence[Sequence[int]]] | None = None):
        """The tree constraints, or the batch's forced prefixes and lexical constraints (not
        with tree constraints)."""
        has_prefix = prefixes is not None and any(len(prefixes[i]) for i in batch)
        has_lexical = constraints is not None and any(len(constraints[i]) for i in batch)
        if not (has_prefix or has_lexical):
            return self.constraints
        if self.constraints is not None:
            raise UsageError("forced prefixes cannot be combined with tree constraints "
                             "(use --no-tree-constraints)")
        from nmt.search.controls import combine
        from nmt.search.lexical import LexicalConstraints
        from nmt.search.prefix import PrefixConstraints

        return combine(PrefixConstraints([prefixes[i] for i in batch]) if has_prefix else None,
                       LexicalConstraints([constraints[i] for i in batch])
                       if has_lexical else None)

    def _hypothesis(self, h) -> TranslationHypothesis:
        d = self.tgt_codec.dictionary
        return TranslationHypothesis(text=self.tgt_codec.decode(h.tokens), ids=h.tokens,
                                     tokens=[d[i] for i in h.tokens], score=h.score,
                                     token_scores=h.token_scores)

    def _batches(self, arrays: list[np.ndarray]) -> list[list[int]]:
        """Non-empty sources, longest first (stable), cut into batches."""
        return longest_first([a.size + 1 for a in arrays], self.max_tokens, self.batch_size,
                             among=(i for i, a in enumerate(arrays) if a.size))

    def _collate(self, arrays: list[np.ndarray]) -> torch.Tensor:
        """[B, S] source tensor: ids + eos, right-padded."""
        width = max(a.size for a in arrays) + 1
        out = np.full((len(arrays), width), PAD, dtype=np.int64)
        for r, a in enumerate(arrays):
            out[r, :a.size] = a
            out[r, a.size] = EOS
        return torch.from_numpy(out).to(self.device)


def load_split(checkpoint: Mapping[str, Any] | str | os.PathLike, split: str = "test", *,
               src_codec=None, texts: bool = True):
    """``(ids, sources)``: the source ids of ``split`` in the data directory the checkpoint was
    trained on (``checkpoint["data_dir"]``), and their decoded text (empty strings when
    ``texts`` is False), ready for ``Translator.translate_ids(ids, sources=sources)``.

    ``checkpoint`` is a path or a dict read with nmt.checkpoint.load_checkpoint;
    ``src_codec`` (default: the checkpoint's) must be the data directory's source codec.
    """
    from nmt.checkpoint import codecs_from_checkpoint, load_checkpoint
    from nmt.data.datadir import DataDir

    ckpt = (checkpoint if isinstance(checkpoint, Mapping)
            else load_checkpoint(checkpoint, mmap=True))
    data_dir = ckpt.get("data_dir")
    if not data_dir:
        raise NmtError("the checkpoint records no data directory; give the sentences to "
                       "translate with --input FILE")
    dd = DataDir.open(data_dir)
    if src_codec is None:
        src_codec = codecs_from_checkpoint(ckpt)[0]
    if not dd.src_codec.same_as(src_codec):
        raise NmtError(f"{data_dir}: its source vocabulary differs from the checkpoint's; "
                       f"give the sentences with --input FILE")
    ds = dd.load_split(split)
    ids = [ds.src(i) for i in range(len(ds))]
    sources = [dd.src_codec.decode(x) for x in ids] if texts else [""] * len(ids)
    log.info("translating split '%s' of %s (%d sentences)", split, data_dir, len(ids))
    return ids, sources


__all__ = ["Translator", "Translation", "TranslationHypothesis", "BatchConfig", "SearchConfig",
           "DEFAULT_SEARCH_TOKENS", "load_split"]
