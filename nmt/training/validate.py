"""Validation during training: loss/perplexity on all ranks; decoding scores on rank 0.

Decoding-based scores (BLEU, chrF, bracket F1) translate the validation split with the same
code as ``nmt-generate`` (``nmt.search.Translator``, beam search with the given
``SearchConfig``), and score with the same code as ``nmt-score`` (``nmt.metrics.scoring``),
against the raw reference file the split was made from when it can be found (as a user would
score ``nmt-generate`` output), else against the decoded references.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Sequence

import torch

from nmt.data.buckets import BOS, TokenBatchSampler, collate
from nmt.data.references import References, split_file
from nmt.search.config import SearchConfig
from nmt.tasks.task import data_task
from nmt.training.distributed import DistInfo, all_reduce_sum

log = logging.getLogger("nmt.train")


def validation_loss(trainer, dataset, sampler: TokenBatchSampler,
                    info: DistInfo) -> dict[str, float]:
    """Mean label-smoothed loss and NLL per target token (nats) and ppl = exp(nll)."""
    loss = torch.zeros((), dtype=torch.float64, device=trainer.device)
    nll = torch.zeros((), dtype=torch.float64, device=trainer.device)
    ntok = 0
    for idx in sampler.shard_batches(0):
        start = getattr(trainer.model, "start_token", BOS)
        l, n, t = trainer.valid_step(None if idx is None else collate(dataset, idx, start))
        loss += l.double()
        nll += n.double()
        ntok += t
    stats = torch.stack([loss, nll, torch.tensor(float(ntok), dtype=torch.float64,
                                                 device=trainer.device)])
    all_reduce_sum(stats, info)
    loss_v, nll_v, ntok_v = stats.tolist()
    if ntok_v == 0:
        return {"loss": float("nan"), "nll_loss": float("nan"), "ppl": float("nan"), "ntokens": 0}
    mean_nll = nll_v / ntok_v
    return {"loss": loss_v / ntok_v, "nll_loss": mean_nll,
            "ppl": math.exp(min(mean_nll, 700.0)), "ntokens": int(ntok_v)}


def load_references(data, split: str, dataset, metrics: Sequence[str]) -> References:
    """What ``metrics`` score ``split`` against: the task's own references (parsing's gold
    trees for bracket-f1), else the raw target file, checked against the split's size."""
    from nmt.io import read_lines

    n = len(dataset)
    task = data_task(data)
    for metric in metrics:
        refs = task.references(metric, data, split, n)
        if refs is not None:
            return refs
    raw = split_file(data, split, data.tgt_lang)
    if raw is not None:
        lines = read_lines(raw)
        if len(lines) == n:
            return References(lines, str(raw))
        log.warning("%s has %d lines but split '%s' has %d sentences: scoring against the "
                    "decoded references", raw, len(lines), split, n)
    decoded = [data.tgt_codec.decode(dataset.tgt(i).tolist()) for i in range(n)]
    return References(decoded, "decoded references")


class DecodingStopped(Exception):
    """``should_stop()`` said yes between two batches of validation decoding."""


def decode_split(model, data, dataset, search: SearchConfig, device: torch.device,
                 should_stop: Callable[[], bool] | None = None) -> list[str]:
    """Translations of every sentence of ``dataset``, in order, as nmt-generate makes them
    (``model``: one model, or a list of them decoded as an ensemble).
    ``should_stop`` is asked after each batch; when it says yes, DecodingStopped is raised."""
    from nmt.search.translator import Translator

    def progress(n: int) -> None:
        if should_stop is not None and should_stop():
            raise DecodingStopped

    models = list(model) if isinstance(model, (list, tuple)) else [model]
    was_training = [m.training for m in models]
    for m in models:
        m.eval()
    try:
        translator = Translator(models, data.src_codec, data.tgt_codec, search=search,
                                device=device)
        ids = [dataset.src(i) for i in range(len(dataset))]
        return [r.text for r in translator.translate_ids(ids, sources=[""] * len(ids),
                                                         progress=progress)]
    finally:
        for m, mode in zip(models, was_training):
            m.train(mode)


def decoding_scores(model, data, dataset, refs: References, search: SearchConfig,
                    device: torch.device, metrics: Sequence[str],
                    should_stop: Callable[[], bool] | None = None) -> dict[str, Any]:
    """{metric: score} for the decoded validation split (sacreBLEU BLEU/chrF, bracket F1).
    When ``should_stop()`` says yes (a signal arrived), decoding stops after the current
    batch and only ``{"decoding_stopped": True}`` is returned: a stopping run must not wait
    for the whole split."""
    from nmt.metrics.scoring import ScoreOptions, corpus_score

    try:
        hyps = decode_split(model, data, dataset, search, device, should_stop)
    except DecodingStopped:
        log.warning("validation decoding stopped by a signal: no %s this time", "/".join(metrics))
        return {"decoding_stopped": True}
    out: dict[str, Any] = {}
    task = data_task(data)
    for metric in metrics:
        scored = task.hypotheses(metric, hyps, refs, data.tgt_codec.dictionary)
        score = corpus_score(metric, scored, [refs.lines], ScoreOptions())
        key = metric.replace("-", "_")
        out[key] = round(score.score, 2)
        if "all" in score.details:
            # EVALB skips sentences it cannot score: say how many it did score.
            out[f"{key}_sentences"] = score.details["all"]["valid_sentences"]
    out["decoded_sentences"] = len(hyps)
    return out


__all__ = ["validation_loss", "load_references", "decode_split", "decoding_scores",
           "References"]
