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
from contextlib import contextmanager
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from nmt.errors import NmtError, UsageError
from nmt.perf import keep_freed_memory
from nmt.runtime import QUANTIZED_PRECISIONS, auto_precision, check_precision, resolve_device
from nmt.search.config import (DEFAULT_SEARCH_TOKENS, BatchConfig, SamplingConfig, SearchConfig,
                               parallel_batches, thread_share)
from nmt.search.ensemble import EnsembleModel
from nmt.search.generator import EOS, PAD, beam_search
from nmt.search.pipeline import Translation, TranslationHypothesis, TranslatorBase
from nmt.tasks.task import Task, get_task, infer_task

log = logging.getLogger("nmt.search")

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


class Translator(TranslatorBase):
    """Beam search translation with one model or an ensemble (nmt's own engine, PyTorch);
    the text pipeline is nmt.search.pipeline's."""

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
        self._set_limits(self.ensemble.max_positions, self.ensemble.decoder_width)

    @property
    def max_positions(self) -> int | None:
        return self.ensemble.max_positions

    def describe(self) -> str:
        return f"{len(self.ensemble)} model(s) on {self.device}, {self.precision}"

    # --- construction -----------------------------------------------------------------------
    @classmethod
    def from_checkpoint(cls, paths: str | os.PathLike | dict | Sequence[str | os.PathLike | dict],
                        *, search: SearchConfig | None = None, batch: BatchConfig | None = None,
                        device: str | torch.device | None = None,
                        precision: str = "fp32", sampling: SamplingConfig | None = None,
                        tree_constraints: bool | None = None, engine: str = "nmt",
                        threads: int | None = None) -> "TranslatorBase":
        """Load one checkpoint or an ensemble (a list of paths sharing their vocabularies).

        Each entry is a path or a checkpoint dict already read with
        nmt.checkpoint.load_checkpoint.

        ``search`` fields left None come from the (first) checkpoint's architecture preset.
        ``device``: cpu, cuda, cuda:N or auto/None (nmt.runtime.resolve_device).
        ``precision`` fp16 needs a GPU; bf16 a GPU or a CPU with native bf16 support; int8
        (the linear layers dynamically quantized, nmt.models.quantize) runs on the CPU only,
        which device auto/None then means. ``sampling`` and ``tree_constraints``: as for the
        constructor.

        ``engine`` "ctranslate2" gives a nmt.engines.ctranslate2.CTranslate2Translator instead
        (one checkpoint path; converted once and cached beside it; ``threads``: CTranslate2's,
        None: one per usable CPU); nmt's own engine takes torch's threads
        (torch.set_num_threads) and ignores ``threads``.
        """
        if engine == "ctranslate2":
            from nmt.engines.ctranslate2 import CTranslate2Translator

            return CTranslate2Translator.from_checkpoint(
                paths, search=search, batch=batch, device=device, precision=precision,
                threads=threads, sampling=sampling, tree_constraints=tree_constraints)
        if engine != "nmt":
            from nmt.engines import ENGINES

            raise UsageError(f"unknown engine '{engine}' (choose from {', '.join(ENGINES)})")
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
                task = checkpoint_task(ckpt, str(name))
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
        if dev.type == "cpu":
            keep_freed_memory()     # as the commands do at start-up (see nmt.perf)
        translator = cls(models, codecs[0], codecs[1],
                         search=(search or SearchConfig()).resolve(cfg), batch=batch, device=dev,
                         sampling=sampling, tree_constraints=tree_constraints, task=task)
        translator.precision = precision
        return translator

    # --- decoding (nmt.search.pipeline.TranslatorBase calls these) ---------------------------
    def _decode_batch(self, batch, arrays, lines, prefixes, constraints, scores=True):
        # (without ``scores``, greedy search of one model skips the softmax over the vocabulary)
        src = self._collate([arrays[i] for i in batch])
        cons = self._constraints(batch, prefixes, constraints)
        if self.sampling is not None:
            from nmt.search.sampling import sample

            return sample(self.ensemble, src, self.search, self.sampling,
                          [lines[i] for i in batch], constraints=cons)
        return beam_search(self.ensemble, src, self.search, constraints=cons, scores=scores)

    def _parallel(self) -> int:
        return parallel_batches(self.batch.parallel, torch.get_num_threads(),
                                self.ensemble.decoder_width, self.search.beam,
                                self.device.type == "cpu")

    @contextmanager
    def _threads_shared(self, n: int):
        # torch's thread count is the process's: each batch's operations run on its share
        threads = torch.get_num_threads()
        torch.set_num_threads(thread_share(threads, n))
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    def _finish(self, results, arrays) -> None:
        if self.search.replace_unk:
            from nmt.search.replace_unk import replace_unknowns

            replace_unknowns(self, results, arrays, self.align_layer)

    def _check_room(self, arrays: list[np.ndarray], constraints, prefixes,
                    lines: Sequence[int]) -> None:
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
                       f"line {lines[i]}")

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
