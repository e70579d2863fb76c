"""Translator: raw sentences in, translations out, in input order (the API nmt-generate uses).

    from nmt import Translator
    t = Translator.from_checkpoint("checkpoint_best.pt", beam=4)
    t.translate(["A man is riding a bike .", ""])          # -> ["Ein Mann ...", ""]
    t.translate_results(lines)                             # scores, tokens, n-best lists

Sentences are encoded with the checkpoint's own codec, sorted by length (longest first) and
batched by ``batch_size`` sentences and/or ``max_tokens`` source tokens (padding included); the
results are put back in input order. An empty line (no subwords) gives an empty translation
without a model call. A source longer than the model accepts (``max_source_len`` subwords, at
most max_positions - 1 for learned positions, the eos taking the last one) is truncated with a
warning naming its line number.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from nmt.errors import NmtError, UsageError
from nmt.search.ensemble import EnsembleModel
from nmt.search.generator import EOS, PAD, SearchConfig, beam_search

log = logging.getLogger("nmt.search")

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DEFAULT_BATCH_SIZE = 64


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


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None or str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise UsageError(f"unknown device '{device}' (use cpu, cuda, cuda:N or auto)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"device '{device}' requested but no CUDA GPU is available")
    return dev


_CPU_BF16_HINT = " (bf16 also runs on CPUs with native bf16 support, e.g. AVX512-BF16)"


def _cpu_bf16(precision: str) -> bool:
    """bf16 on a CPU with native bf16 matrix units: about twice the fp32 speed, opt-in,
    since it rounds weights and activations to 8 significant bits (check BLEU)."""
    if precision != "bf16":
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


class Translator:
    """Beam search translation with one model or an ensemble, plus the text pipeline."""

    def __init__(self, models: Sequence[torch.nn.Module], src_codec, tgt_codec, *,
                 beam: int = 4, lenpen: float = 0.6, max_len_a: float = 1.0, max_len_b: int = 50,
                 nbest: int = 1, batch_size: int | None = None, max_tokens: int | None = None,
                 max_source_len: int = 1024, device: str | torch.device | None = "cpu"):
        self.search = SearchConfig(beam=beam, lenpen=lenpen, max_len_a=max_len_a,
                                   max_len_b=max_len_b, nbest=nbest)
        if batch_size is not None and batch_size < 1:
            raise UsageError(f"batch size must be >= 1, got {batch_size}")
        if max_tokens is not None and max_tokens < 1:
            raise UsageError(f"max tokens must be >= 1, got {max_tokens}")
        if max_source_len < 1:
            raise UsageError(f"max source length must be >= 1, got {max_source_len}")
        self.batch_size = batch_size if batch_size is not None or max_tokens is not None \
            else DEFAULT_BATCH_SIZE
        self.max_tokens = max_tokens
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.ensemble = EnsembleModel(models)
        self.src_codec, self.tgt_codec = src_codec, tgt_codec
        limit = self.ensemble.max_positions
        # The encoder reads ids + eos, so learned positions leave max_positions - 1 for ids.
        self.max_source_len = max_source_len if limit is None else min(max_source_len, limit - 1)

    # --- construction -----------------------------------------------------------------------
    @classmethod
    def from_checkpoint(cls, paths: str | os.PathLike | dict | Sequence[str | os.PathLike | dict],
                        *, device: str | torch.device | None = None, beam: int | None = None,
                        lenpen: float | None = None, max_len_a: float | None = None,
                        max_len_b: int | None = None, nbest: int = 1,
                        batch_size: int | None = None, max_tokens: int | None = None,
                        max_source_len: int = 1024, precision: str = "fp32") -> "Translator":
        """Load one checkpoint or an ensemble (a list of paths sharing their vocabularies).

        Each entry is a path or a checkpoint dict already read with
        nmt.training.checkpoint.load_checkpoint.

        Decoding options left as None come from the (first) checkpoint's architecture preset.
        ``precision`` fp16 needs a GPU; bf16 a GPU or a CPU with native bf16 support.
        """
        from nmt.data.codec import TextCodec
        from nmt.training.checkpoint import load_model_from_checkpoint, model_config

        if isinstance(paths, (str, os.PathLike, dict)):
            paths = [paths]
        if not paths:
            raise UsageError("no checkpoint given")
        dev = resolve_device(device)
        if precision not in PRECISIONS:
            raise UsageError(f"unknown precision '{precision}' (choose fp32, bf16 or fp16)")
        if precision != "fp32" and dev.type != "cuda" and not _cpu_bf16(precision):
            raise UsageError(f"--precision {precision} needs a GPU{_CPU_BF16_HINT}; "
                             f"on this CPU use fp32")
        models, codecs, cfg = [], None, None
        names = [p if not isinstance(p, dict) else f"checkpoint {i + 1}"
                 for i, p in enumerate(paths)]
        for p, name in zip(paths, names):
            model, ckpt = load_model_from_checkpoint(p, device=dev)
            try:
                src = TextCodec.from_state(ckpt["src_codec"])
                tgt = TextCodec.from_state(ckpt["tgt_codec"])
            except (KeyError, TypeError, ValueError) as e:
                raise NmtError(f"{name}: checkpoint has an unreadable text codec ({e})") from None
            if codecs is None:
                codecs, cfg = (src, tgt), model_config(ckpt)
            elif not (src.same_as(codecs[0]) and tgt.same_as(codecs[1])):
                raise UsageError(f"{name}: cannot ensemble checkpoints with different "
                                 f"vocabularies or subword models (compare with {names[0]})")
            models.append(model.to(PRECISIONS[precision]).eval())
        return cls(models, codecs[0], codecs[1],
                   beam=cfg.beam if beam is None else beam,
                   lenpen=cfg.lenpen if lenpen is None else lenpen,
                   max_len_a=cfg.max_len_a if max_len_a is None else max_len_a,
                   max_len_b=cfg.max_len_b if max_len_b is None else max_len_b,
                   nbest=nbest, batch_size=batch_size, max_tokens=max_tokens,
                   max_source_len=max_source_len, device=dev)

    # --- translation ------------------------------------------------------------------------
    def translate(self, lines: Sequence[str]) -> list[str]:
        """The best translation of each line, in order (empty line -> empty string)."""
        return [t.text for t in self.translate_results(lines)]

    def translate_results(self, lines: Sequence[str], progress: Callable[[int], None] | None = None,
                          first_line: int = 1) -> list[Translation]:
        """Rich results (scores, tokens, n-best) for raw sentences, in input order.

        ``progress(n)`` is called after each batch with the number of sentences it finished;
        ``first_line`` is the line number of ``lines[0]`` in warnings.
        """
        lines = list(lines)
        ids = self.src_codec.encode_batch(lines) if lines else []
        return self.translate_ids(ids, sources=lines, progress=progress, first_line=first_line)

    def translate_ids(self, ids: Sequence[Sequence[int] | np.ndarray],
                      sources: Sequence[str] | None = None,
                      progress: Callable[[int], None] | None = None,
                      first_line: int = 1) -> list[Translation]:
        """Translate already-encoded sources (ids without eos), e.g. a binarized test split."""
        n = len(ids)
        if sources is None:
            sources = [self.src_codec.decode(x) for x in ids]
        results = [Translation(i, sources[i]) for i in range(n)]
        arrays: list[np.ndarray] = []
        vocab = len(self.src_codec.dictionary)
        for i, x in enumerate(ids):
            a = np.asarray(x, dtype=np.int64).reshape(-1)
            if a.size and (int(a.min()) < 0 or int(a.max()) >= vocab):
                raise NmtError(f"line {first_line + i}: source id outside the vocabulary "
                               f"(0..{vocab - 1})")
            if a.size > self.max_source_len:
                log.warning("line %d: source has %d subwords, more than the %d the model "
                            "accepts; truncated", first_line + i, a.size, self.max_source_len)
                a = a[:self.max_source_len]
                results[i].truncated = True
            arrays.append(a)
        empty = [i for i in range(n) if arrays[i].size == 0]
        if progress is not None and empty:
            progress(len(empty))
        for batch in self._batches(arrays):
            src = self._collate([arrays[i] for i in batch])
            hyps = beam_search(self.ensemble, src, self.search)
            for i, sent_hyps in zip(batch, hyps):
                results[i].hypotheses = [self._hypothesis(h) for h in sent_hyps]
            if progress is not None:
                progress(len(batch))
        return results

    def _hypothesis(self, h) -> TranslationHypothesis:
        d = self.tgt_codec.dictionary
        return TranslationHypothesis(text=self.tgt_codec.decode(h.tokens), ids=h.tokens,
                                     tokens=[d[i] for i in h.tokens], score=h.score,
                                     token_scores=h.token_scores)

    def _batches(self, arrays: list[np.ndarray]) -> Iterable[list[int]]:
        """Non-empty sources sorted longest first (stable), cut into batches."""
        order = sorted((i for i in range(len(arrays)) if arrays[i].size),
                       key=lambda i: -arrays[i].size)
        batch: list[int] = []
        width = 0                                  # longest source in the batch, with eos
        for i in order:
            w = max(width, arrays[i].size + 1)
            full = batch and ((self.batch_size is not None and len(batch) >= self.batch_size)
                              or (self.max_tokens is not None
                                  and w * (len(batch) + 1) > self.max_tokens))
            if full:
                yield batch
                batch, w = [], arrays[i].size + 1
            batch.append(i)
            width = w
        if batch:
            yield batch

    def _collate(self, arrays: list[np.ndarray]) -> torch.Tensor:
        """[B, S] source tensor: ids + eos, right-padded."""
        width = max(a.size for a in arrays) + 1
        out = np.full((len(arrays), width), PAD, dtype=np.int64)
        for r, a in enumerate(arrays):
            out[r, :a.size] = a
            out[r, a.size] = EOS
        return torch.from_numpy(out).to(self.device)


__all__ = ["Translator", "Translation", "TranslationHypothesis", "resolve_device", "PRECISIONS"]
