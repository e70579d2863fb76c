"""Teacher-forced passes of a trained model over given source/target pairs: scores, alignments.

    from nmt.search.forced import align, align_lines, score_pairs
    t = Translator.from_checkpoint("checkpoint_best.pt")
    score_pairs(t, ["a b c"], ["c b a"])        # -> [PairScore(log_prob=..., score=...)]
    align_lines(t, ["a b c"], ["c b a"])        # -> [[2, 1, 0]]: a source word per target word

Scoring (the tool for filtering parallel data): the model reads the source and the whole
target at once (teacher forcing: bos + target -> target + eos) and each target token gets the
log-probability the model gives it there. The sum over the tokens and the final eos is
log P(Y | X), exactly what beam search accumulates for the same output, and ``score`` divides it
by the same length penalty (nmt.search.length_penalty, alpha = ``translator.search.lenpen``),
so scoring the beam's own output gives the beam's score (to float rounding); one exception:
with the ``hf`` formula the beam gives an eos forced at the length limit log-probability 0,
as transformers does, and scoring gives it the model's. An ensemble
averages the models' probabilities, as its beam search does (nmt.search.ensemble). Scores are
the model's own: tree constraints (nmt.search.constraints), which can change what the beam
search scores for lexicalized trees, do not apply here.

Alignments: for each target token, the source token its decoder's encoder-decoder attention
weighs most at the step that predicts it, averaged over the heads of one decoder layer (the
penultimate by default, see :func:`align`) and over the models of an ensemble. The weights are
recomputed from that layer's own queries (captured with a forward hook while the hook is
needed, so normal decoding pays nothing) and the encoder keys.

Sentences are sorted by length and batched like the Translator's (``BatchConfig``: at most
``batch_size`` pairs and/or ``max_tokens`` tokens of the longer side, padding included);
results come back in input order and do not depend on the batching beyond float rounding.
An empty source is scored as the model sees it (the encoder reads the eos alone); an empty
target scores its eos alone. Sources longer than ``translator.max_source_len`` are truncated
as the Translator truncates them, targets longer than the decoder's learned positions allow
are truncated before their eos; both with a warning, and ``truncated`` set on the result.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from torch import Tensor

from nmt.errors import NmtError, UsageError
from nmt.search.config import BatchConfig
from nmt.data.buckets import longest_first
from nmt.search.length_penalty import length_penalty
from nmt.specials import BOS, EOS, PAD

log = logging.getLogger("nmt.search")

ROWS_PER_PROJECTION = 1 << 25   # at most this many logits [tokens x vocabulary] at a time
WORD_START = "\u2581"           # sentencepiece's word-initial marker '▁'
CONTINUATION = "##"             # wordpiece's continuation prefix


@dataclass
class PairScore:
    index: int                    # 0-based position in the input
    log_prob: float               # log P(target | source): sum over the tokens and the eos
    per_token: float              # log_prob / n_tokens
    score: float                  # log_prob / lp(n_tokens), the beam search's score
    n_tokens: int                 # target subwords + 1 (the eos)
    token_scores: list[float] = field(default_factory=list)   # log-prob of each token
    truncated: bool = False       # the source or the target was cut to the model's limits

    def to_json(self) -> dict:
        out = {"id": self.index, "score": round(self.score, 6),
               "log_prob": round(self.log_prob, 6), "per_token": round(self.per_token, 6),
               "n_tokens": self.n_tokens}
        if self.truncated:
            out["truncated"] = True
        return out


# --- public API --------------------------------------------------------------------------------

def score_pairs(translator, sources: Sequence[str], targets: Sequence[str], *,
                batch: BatchConfig | None = None, lenpen: float | None = None,
                progress: Callable[[int], None] | None = None,
                first_line: int = 1) -> list[PairScore]:
    """Teacher-forced scores of raw sentence pairs, one per pair, in input order.

    ``translator``: an nmt.search.translator.Translator (its models, codecs, device and, unless
    ``batch`` is given, its BatchConfig). ``lenpen``: alpha of ``score`` (default: the
    translator's ``search.lenpen``, the one its beam search ranks by). ``progress(n)`` is called
    after each batch with the number of pairs it finished; ``first_line`` is the line number of
    the first pair in warnings and errors.
    """
    src_ids, tgt_ids = _encode_pairs(translator, sources, targets)
    return score_ids(translator, src_ids, tgt_ids, batch=batch, lenpen=lenpen,
                     progress=progress, first_line=first_line)


def score_ids(translator, source_ids: Sequence[Sequence[int] | np.ndarray],
              target_ids: Sequence[Sequence[int] | np.ndarray], *,
              batch: BatchConfig | None = None, lenpen: float | None = None,
              progress: Callable[[int], None] | None = None,
              first_line: int = 1) -> list[PairScore]:
    """:func:`score_pairs` of already-encoded pairs (ids without eos)."""
    alpha = translator.search.lenpen if lenpen is None else float(lenpen)
    formula = translator.search.formula
    if alpha < 0:
        raise UsageError(f"lenpen must be >= 0, got {alpha}")
    srcs, tgts, truncated = _prepare(translator, source_ids, target_ids, first_line)
    results: list[PairScore | None] = [None] * len(srcs)
    models = translator.ensemble.models
    start = translator.ensemble.start_token
    with _evaluating(models):
        for rows in _batches(srcs, tgts, batch or translator.batch):
            src, prev, gold = _collate(srcs, tgts, rows, translator.device, start)
            lprobs = _token_log_probs(models, src, prev, gold).cpu()      # [B, T]
            for r, i in enumerate(rows):
                n = tgts[i].size + 1
                ts = lprobs[r, :n].tolist()
                total = float(sum(ts))
                results[i] = PairScore(first_line - 1 + i, total, total / n,
                                       total / length_penalty(n, alpha, formula), n, ts,
                                       truncated[i])
            if progress is not None:
                progress(len(rows))
    return results  # type: ignore[return-value]


def attention_weights(translator, source_ids, target_ids, layer: int | None = None, *,
                      batch: BatchConfig | None = None) -> list[np.ndarray]:
    """Teacher-forced encoder-decoder attention of one decoder layer, per pair a float32 array
    [T + 1, S + 1] (T target and S source subwords, after any truncation): row t is the
    decoder step that predicts target token t (row T predicts the eos), column j source token j
    (column S is the source's eos). Averaged over the layer's heads and over the models of an
    ensemble; each row sums to 1. ``layer``: see :func:`align`."""
    srcs, tgts, _ = _prepare(translator, source_ids, target_ids, 1)
    out: list[np.ndarray | None] = [None] * len(srcs)
    models = translator.ensemble.models
    indices = [_layer_index(m, layer) for m in models]
    start = translator.ensemble.start_token
    with _evaluating(models):
        for rows in _batches(srcs, tgts, batch or translator.batch):
            src, prev, _ = _collate(srcs, tgts, rows, translator.device, start)
            total = None
            for m, li in zip(models, indices):
                w = _cross_attention_heads(m, li, src, prev).mean(dim=1)   # [B, T, S]
                total = w if total is None else total.add_(w)
            total = total.div_(len(models)).cpu().numpy()
            for r, i in enumerate(rows):
                out[i] = total[r, :tgts[i].size + 1, :srcs[i].size + 1].copy()
    return out  # type: ignore[return-value]


def align(translator, source_ids, target_ids, layer: int | None = None, *,
          batch: BatchConfig | None = None) -> list[list[int]]:
    """Per pair, for each target subword (the eos excluded: one entry per id of
    ``target_ids``), the position in ``source_ids`` its attention weighs most, or -1 when the
    source is empty. The source eos is left out of the choice (it attracts attention without
    being aligned to anything, as fairseq's alignment extraction also treats it).

    The weights are those of the decoder step that predicts the token, averaged over the heads
    of decoder layer ``layer`` (0-based; negative counts from the top, as Python indexing) and
    over the models of an ensemble. Default: the penultimate layer (the only one of a one-layer
    decoder). That is a convention from the literature, not something this model was trained
    for: Garg et al. (2019), "Jointly Learning to Align and Translate with Transformer Models",
    found that the head-averaged attention of the penultimate decoder layer aligns best
    (lowest alignment error rate) among the layers of a 6-layer Transformer. It is no law: the
    2-layer test model of tests/test_forced.py, trained to reverse its input, aligns with its
    last layer (96% of tokens to the mirrored position) and not with its first (43%), so
    compare layers on a few hand-aligned pairs when the alignments matter.
    """
    out = []
    for w in attention_weights(translator, source_ids, target_ids, layer, batch=batch):
        t, s = w.shape[0] - 1, w.shape[1] - 1
        out.append([-1] * t if s == 0 else [int(j) for j in w[:t, :s].argmax(axis=1)])
    return out


def align_lines(translator, sources: Sequence[str], targets: Sequence[str],
                layer: int | None = None, *, words: bool = True,
                batch: BatchConfig | None = None) -> list[list[int]]:
    """:func:`align` of raw sentence pairs; with ``words`` (default) mapped to words by
    :func:`words_alignment` (per target word, a source word index), else per subword."""
    src_ids, tgt_ids = _encode_pairs(translator, sources, targets)
    subword = align(translator, src_ids, tgt_ids, layer, batch=batch)
    if not words:
        return subword
    out = []
    for s, t, a in zip(sources, targets, subword):
        tp = translator.tgt_codec.pieces(t)[:len(a)]
        out.append(words_alignment(translator.src_codec.pieces(s), tp, a,
                                   src_kind=translator.src_codec.kind,
                                   tgt_kind=translator.tgt_codec.kind))
    return out


def word_indices(pieces: Sequence[str], kind: str | None = None) -> list[int]:
    """The word each subword piece belongs to (0-based).

    ``kind`` is the codec's (TextCodec.kind): ``bpe`` (sentencepiece: a piece starting with
    '▁' starts a word, any other continues it), ``wordpiece`` (a piece starting with '##'
    continues a word, any other starts one), ``subword_nmt`` (a piece after one ending in '@@'
    continues a word; ``fairseq_sentencepiece`` follows the ``bpe`` rule) or ``none`` (one
    piece per word). None guesses:
    sentencepiece when some piece starts with '▁', else the wordpiece rule (which is also right
    for whitespace tokens, unless a token itself starts with '##').
    """
    if kind is None:
        kind = "bpe" if any(p.startswith(WORD_START) for p in pieces) else "wordpiece"
    if kind == "fairseq_sentencepiece":
        kind = "bpe"
    out, word = [], -1
    for i, p in enumerate(pieces):
        if kind == "subword_nmt":       # "@@" ends a piece whose word goes on (fairseq BPE)
            starts = i == 0 or not pieces[i - 1].endswith("@@")
        else:
            starts = (i == 0 or kind == "none"
                      or (kind == "bpe" and p.startswith(WORD_START))
                      or (kind != "bpe" and not p.startswith(CONTINUATION)))
        word += starts
        out.append(word)
    return out


def words_alignment(src_pieces: Sequence[str], tgt_pieces: Sequence[str],
                    subword_alignment: Sequence[int], *, src_kind: str | None = None,
                    tgt_kind: str | None = None) -> list[int]:
    """Per target word, the source word it aligns to: the source word that most of its
    subwords align to, ties going to the one its earliest subword aligns to (so a one-subword
    word keeps its subword's link); -1 when none of its subwords is aligned (empty source).

    ``subword_alignment`` holds one source subword position (or -1) per target piece, as
    :func:`align` gives; pieces are the codecs' ``pieces(line)``; kinds as in
    :func:`word_indices`.
    """
    if len(subword_alignment) != len(tgt_pieces):
        raise ValueError(f"{len(subword_alignment)} alignment links for "
                         f"{len(tgt_pieces)} target pieces")
    src_word = word_indices(src_pieces, src_kind)
    tgt_word = word_indices(tgt_pieces, tgt_kind)
    votes: list[list[int]] = [[] for _ in range(tgt_word[-1] + 1 if tgt_word else 0)]
    for w, j in zip(tgt_word, subword_alignment):
        if not -1 <= j < len(src_pieces):
            raise ValueError(f"source position {j} outside 0..{len(src_pieces) - 1}")
        if j >= 0:
            votes[w].append(src_word[j])
    out = []
    for v in votes:
        if not v:
            out.append(-1)
            continue
        counts = Counter(v)
        best = max(counts.values())
        out.append(next(x for x in v if counts[x] == best))
    return out


def to_pharaoh(alignment: Iterable[int]) -> str:
    """'source-target' index pairs (Pharaoh format, as fast_align writes), unaligned left out:
    [2, 1, -1, 0] -> '2-0 1-1 0-3'."""
    return " ".join(f"{s}-{t}" for t, s in enumerate(alignment) if s >= 0)


# --- preparation and batching ------------------------------------------------------------------

def _encode_pairs(translator, sources, targets) -> tuple[list, list]:
    for name, lines in (("sources", sources), ("targets", targets)):
        if isinstance(lines, (str, bytes)):
            raise TypeError(f"{name} must be a list of sentences, not one string")
        bad = next((i for i, x in enumerate(lines) if not isinstance(x, str)), None)
        if bad is not None:
            raise TypeError(f"{name}[{bad}] is {type(lines[bad]).__name__}, not str")
    if len(sources) != len(targets):
        raise NmtError(f"{len(sources)} sources but {len(targets)} targets: "
                       f"scoring needs one target per source")
    if not sources:
        return [], []
    return (translator.src_codec.encode_batch(list(sources)),
            translator.tgt_codec.encode_batch(list(targets)))


def _prepare(translator, source_ids, target_ids, first_line: int
             ) -> tuple[list[np.ndarray], list[np.ndarray], list[bool]]:
    """Ids as int64 arrays, checked against the vocabularies and cut to the model's limits."""
    if len(source_ids) != len(target_ids):
        raise NmtError(f"{len(source_ids)} sources but {len(target_ids)} targets")
    limit = translator.ensemble.max_positions
    # The decoder reads bos + target ids (one position each) to predict ids + eos.
    max_target = None if limit is None else limit - 1
    srcs, tgts, truncated = [], [], []
    for i, (x, y) in enumerate(zip(source_ids, target_ids)):
        line = first_line + i
        a, cut = translator.source_array(x, line)       # checked and cut as the Translator does
        b = _checked(y, len(translator.tgt_codec.dictionary), line, "target")
        if max_target is not None and b.size > max_target:
            log.warning("line %d: target has %d subwords, more than the %d the model can "
                        "score; truncated", line, b.size, max_target)
            b, cut = b[:max_target], True
        srcs.append(a)
        tgts.append(b)
        truncated.append(cut)
    return srcs, tgts, truncated


def _checked(x, vocab: int, line: int, side: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.int64).reshape(-1)
    if a.size and (int(a.min()) < 0 or int(a.max()) >= vocab):
        raise NmtError(f"line {line}: {side} id outside the vocabulary (0..{vocab - 1})")
    return a


def _batches(srcs: list[np.ndarray], tgts: list[np.ndarray], cfg: BatchConfig) -> list[list[int]]:
    """Pairs sorted by their longer side, longest first (ties: the longer source first), cut
    into batches of at most ``cfg.batch_size`` pairs and ``cfg.max_tokens`` padded tokens of the
    longer side; 64 pairs when neither is set (a batch's logits are pairs x target length x
    vocabulary)."""
    width = [max(s.size, t.size) + 1 for s, t in zip(srcs, tgts)]     # + eos (or bos)
    sentences = (FORCED_BATCH_SIZE if cfg.batch_size is None and cfg.max_tokens is None
                 else cfg.batch_size)
    return longest_first(width, cfg.max_tokens, sentences, tie=[s.size for s in srcs])


FORCED_BATCH_SIZE = 64


def _collate(srcs, tgts, rows: list[int], device, start: int = BOS
              ) -> tuple[Tensor, Tensor, Tensor]:
    """Source ids + eos [B, S], decoder input start (bos) + ids [B, T] and gold ids + eos
    [B, T], all right-padded."""
    s_width = max(srcs[i].size for i in rows) + 1
    t_width = max(tgts[i].size for i in rows) + 1
    src = np.full((len(rows), s_width), PAD, dtype=np.int64)
    prev = np.full((len(rows), t_width), PAD, dtype=np.int64)
    gold = np.full((len(rows), t_width), PAD, dtype=np.int64)
    for r, i in enumerate(rows):
        a, b = srcs[i], tgts[i]
        src[r, :a.size], src[r, a.size] = a, EOS
        prev[r, 0], prev[r, 1:b.size + 1] = start, b
        gold[r, :b.size], gold[r, b.size] = b, EOS
    return tuple(torch.from_numpy(x).to(device) for x in (src, prev, gold))  # type: ignore


@contextlib.contextmanager
def _evaluating(models):
    """Eval mode and no autograd for the pass; training flags restored afterwards."""
    flags = [m.training for m in models]
    try:
        for m in models:
            m.eval()
        with torch.no_grad():
            yield
    finally:
        for m, f in zip(models, flags):
            m.train(f)


# --- model passes ------------------------------------------------------------------------------

def _token_log_probs(models, src: Tensor, prev: Tensor, gold: Tensor) -> Tensor:
    """[B, T] float32 log-probability of each gold token (0 at padding); an ensemble's is the
    log of the mean of the models' probabilities, as in nmt.search.ensemble."""
    keep = gold.ne(PAD)
    per_model = []
    for m in models:
        hidden = m.decode_full(prev, m.encode(src), return_hidden=True)[keep]    # [N, D]
        per_model.append(_gold_log_probs(m, hidden, gold[keep]))
    lp = per_model[0] if len(models) == 1 else (
        torch.stack(per_model).logsumexp(0) - math.log(len(models)))
    out = torch.zeros(gold.shape, dtype=torch.float32, device=gold.device)
    out[keep] = lp
    return out


def _gold_log_probs(model, hidden: Tensor, gold: Tensor) -> Tensor:
    """log softmax(projection(hidden))[gold], [N] float32, a slice of rows at a time."""
    vocab = model.tgt_embed.weight.size(0)
    step = max(1, ROWS_PER_PROJECTION // vocab)
    parts = []
    for start in range(0, hidden.size(0), step):
        logits = model.output_projection(hidden[start:start + step])
        lprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
        parts.append(lprobs.gather(1, gold[start:start + step, None]).squeeze(1))
    return torch.cat(parts) if parts else hidden.new_zeros(0, dtype=torch.float32)


def _layer_index(model, layer: int | None) -> int:
    layers = getattr(model, "decoder_layers", None)
    if layers is None:
        raise NmtError(f"alignments need a Transformer (nmt.models), not "
                       f"{type(model).__name__}")
    n = len(layers)
    if layer is None:
        return max(n - 2, 0)
    if not -n <= layer < n:
        raise UsageError(f"decoder layer {layer} does not exist: the model has {n} "
                         f"(0..{n - 1}, or -{n}..-1 from the top)")
    return layer % n


def _cross_attention_heads(model, index: int, src: Tensor, prev: Tensor) -> Tensor:
    """Encoder-decoder attention weights [B, H, T, S] (float32) of decoder layer
    ``index`` in a teacher-forced pass: the layer's queries are captured from its query
    projection during the pass, the keys recomputed from the encoder output, and
    softmax(q k^T / sqrt(dk)) taken with the source padding masked, as the layer computes it."""
    attn = model.decoder_layers[index].cross_attn
    captured: list[Tensor] = []
    hook = attn.q_proj.register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        enc = model.encode(src)
        model.decode_full(prev, enc, return_hidden=True)
    finally:
        hook.remove()
    b, t, _ = captured[0].shape
    q = captured[0].view(b, t, attn.heads, attn.d_k).transpose(1, 2)     # [B, H, T, dk]
    k, _ = attn.project_kv(enc.out)                                       # [B, H, S, dk]
    logits = torch.matmul(q.float(), k.float().transpose(-1, -2)) / math.sqrt(attn.d_k)
    mask = enc.attn_mask()                                                # [B, 1, 1, S]
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    return logits.softmax(dim=-1)


__all__ = ["PairScore", "score_pairs", "score_ids", "attention_weights", "align", "align_lines",
           "word_indices", "words_alignment", "to_pharaoh"]
