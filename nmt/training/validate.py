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
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from nmt.data.batching import BOS, TokenBatchSampler, collate
from nmt.errors import NmtError
from nmt.search.config import SearchConfig
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


@dataclass
class References:
    """What decoded validation output is scored against."""

    lines: list[str]
    origin: str                  # the file, or "decoded references"
    sources: list[str] | None = None   # source words (bracket F1 de-linearizes over them)


def _split_file(data, split: str, suffix: str) -> Path | None:
    """The raw file ``<prefix>.<suffix>`` that ``split`` was binarized from, if it exists."""
    info_of = getattr(data, "split_info", None)
    if info_of is None:
        return None
    info = info_of(split)
    prefix = info.get("source_path") or info.get("source_prefix")
    if not prefix:
        return None
    candidates = [Path(f"{prefix}.{suffix}")]
    base = getattr(data, "path", None)
    if base is not None and not os.path.isabs(prefix):
        candidates.append(Path(base).parent / f"{prefix}.{suffix}")
    return next((p for p in candidates if p.is_file()), None)


def load_references(data, split: str, dataset, metrics: Sequence[str]) -> References:
    """Raw references of ``split`` (gold trees for bracket-f1), checked against its size."""
    from nmt.io import read_lines

    n = len(dataset)
    if "bracket-f1" in metrics:
        gold = _split_file(data, split, "gold")
        if gold is None:
            raise NmtError(f"--best-checkpoint-metric bracket-f1 needs the gold trees of the "
                           f"'{split}' split (<prefix>.gold beside the files it was made from, "
                           f"as examples/parsing_wsj/prepare.py writes them)")
        lines = read_lines(gold)
        _check_count(lines, n, gold)
        # The trees are built over the gold trees' own words: decoding the binarized source
        # would give <unk> for unknown words (and a signature source, prepare.py --signatures,
        # its signatures), which EVALB rejects as words that differ from the gold's.
        words = [" ".join(_tree_words(line, f"{gold}:{i + 1}")) for i, line in enumerate(lines)]
        return References(lines, str(gold), words)
    raw = _split_file(data, split, data.tgt_lang)
    if raw is not None:
        lines = read_lines(raw)
        if len(lines) == n:
            return References(lines, str(raw))
        log.warning("%s has %d lines but split '%s' has %d sentences: scoring against the "
                    "decoded references", raw, len(lines), split, n)
    decoded = [data.tgt_codec.decode(dataset.tgt(i).tolist()) for i in range(n)]
    return References(decoded, "decoded references")


def _tree_words(line: str, name: str) -> list[str]:
    from nmt.tasks.trees import read_trees_text

    trees = read_trees_text(line, name)
    if len(trees) != 1:
        raise NmtError(f"{name}: expected one tree, found {len(trees)}")
    return trees[0].words()


def _check_count(lines: Sequence[str], n: int, path: Path) -> None:
    if len(lines) != n:
        raise NmtError(f"{path} has {len(lines)} lines but the validation split has {n} "
                       f"sentences")


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
    for metric in metrics:
        if metric == "bracket-f1":
            from nmt.tasks.parsing import delinearize
            from nmt.tasks.trees import to_string

            from nmt.search.constraints import tree_leaves

            leaves = tree_leaves(data.tgt_codec.dictionary) or "xx"
            trees = [to_string(delinearize(h, (refs.sources or [""])[i].split(), leaves=leaves))
                     for i, h in enumerate(hyps)]
            score = corpus_score(metric, trees, [refs.lines], ScoreOptions())
            out["bracket_f1"] = round(score.score, 2)
            # EVALB skips sentences it cannot score: say how many it did score.
            out["bracket_f1_sentences"] = score.details["all"]["valid_sentences"]
        else:
            score = corpus_score(metric, hyps, [refs.lines], ScoreOptions())
            out[metric] = round(score.score, 2)
    out["decoded_sentences"] = len(hyps)
    return out


__all__ = ["validation_loss", "load_references", "decode_split", "decoding_scores",
           "References"]
