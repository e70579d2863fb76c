"""Greedy decoding: the most probable next token of every row, until its eos.

Beam search with beam 1 decodes the same thing (it stops a sentence at its first eos, the
fairseq rule), through machinery that greedy decoding does not need: a top-2 per row and a
stable sort, the finished/live split, a reorder of the whole cache by the identity
permutation every step and index_selects of the token history. :func:`greedy_search` is that
search without them, and gives the same hypotheses (tokens, token log-probabilities and
length-normalized scores, bit for bit): the same float32 softmax of each row's logits, the
same float32 sums of log-probabilities and the same length penalty. An ensemble's token is
the first maximal probability (the smallest id among ties, as beam search's stable top-k);
one model's is its largest logit (the smallest id among ties), the same token unless two
logits differ by less than float32's softmax can tell apart, where beam search takes the
smaller id. So is the other difference, by design: where two probabilities differ by so
little that their float32 sums with the prefix's score are equal, beam search ranks them as
tied and takes the smaller id; greedy decoding takes the more probable token.

Choosing by logits lets a caller that needs no scores (text output) skip the softmax over
the vocabulary: ``scores=False`` gives the same tokens, with scores None.

A float32 row's probabilities do not depend on the other rows of its batch, so finished
sentences need not leave it at once: they stay, decoded on but ignored, until they are a
quarter of the rows (COMPACT_AT), and then all leave in one copy of the cache, instead of a
copy at every step where one finishes.

It applies where beam search with beam 1 would stop at the first eos: one hypothesis, no
constraints or decoding controls, no diverse groups, and a length penalty other than
transformers' ("hf" may go on past a finished hypothesis). :func:`applies` says which.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.search.beam import first_max, never_chosen
from nmt.search.controls import DecodingControls
from nmt.search.length_penalty import length_penalty
from nmt.specials import EOS, PAD

# Finished rows leave the batch once they are this share of its rows: until then each costs a
# row of every decoder step, and each compaction a copy of the whole cache.
COMPACT_AT = 0.25


def applies(cfg, constraints=None) -> bool:
    """Whether greedy_search decodes what beam_search would with this resolved config."""
    return (cfg.beam == 1 and cfg.nbest == 1 and constraints is None
            and cfg.diverse_beam_groups == 1 and cfg.formula != "hf"
            and DecodingControls.from_search(cfg) is None)


@torch.inference_mode()
def greedy_search(model, src_tokens: Tensor, cfg, max_len: Tensor,
                  scores: bool = True) -> list[list[tuple]]:
    """Translate src_tokens [B, S] greedily with ``model`` (nmt.search.ensemble.EnsembleModel);
    ``max_len`` [B]: the most tokens before eos (nmt.search.generator.max_lengths). Returns
    per sentence a list of one hypothesis (tokens, score, token log-probabilities), or none
    when every token had probability 0, as beam_search does with beam 1. ``scores=False``:
    a single model's search computes no probabilities, and each hypothesis's score and token
    log-probabilities are None (the tokens are the same)."""
    device = src_tokens.device
    bsz = src_tokens.size(0)
    n_steps = int(max_len.max()) + 1
    state = model.init_state(model.encode(src_tokens), group=1)
    sent = torch.arange(bsz, device=device)                          # [N] index in the batch
    tokens = torch.full((bsz, n_steps + 1), PAD, dtype=torch.long, device=device)
    tokens[:, 0] = model.start_token
    tok_scores = torch.zeros(bsz, n_steps, device=device)
    total = torch.zeros(bsz, device=device)                          # [N] log P(prefix)
    out: list[list] = [[] for _ in range(bsz)]
    penalty = (cfg.lenpen, cfg.formula)
    step_logits = getattr(model, "step_logits", None)                # one model: its logits
    if step_logits is None:
        scores = True

    live = torch.ones(bsz, dtype=torch.bool, device=device)         # [N] still decoding
    n_live = bsz
    for step in range(n_steps):
        prev = tokens[:, step:step + 1]
        at_max = max_len.eq(step)
        forced = bool(at_max.any())
        if step_logits is not None:
            logits, state = step_logits(prev, state)                 # [N, V]
            best, lp = _choose_by_logits(logits, at_max if forced else None, scores)
        else:
            probs, state = model.step(prev, state)                   # [N, V] float32
            best, lp = _choose(probs, at_max if forced else None)
        tokens[:, step + 1] = best
        if scores:
            tok_scores[:, step] = lp
            total = total + lp
            finite = torch.isfinite(total)
            ended = (best.eq(EOS) | ~finite) & live                  # eos, or probability 0
        else:
            ended = best.eq(EOS) & live
        if not bool(ended.any()):
            continue
        fin = (ended & finite).nonzero().squeeze(1) if scores else ended.nonzero().squeeze(1)
        if fin.numel():
            rows = zip(sent[fin].tolist(), tokens[fin, 1:step + 2].tolist())
            if scores:
                norm = total[fin] / length_penalty(step + 1, *penalty)
                for (i, toks), s, ts in zip(rows, norm.tolist(),
                                            tok_scores[fin, :step + 1].tolist()):
                    out[i] = [(toks, s, ts)]
            else:
                for i, toks in rows:
                    out[i] = [(toks, None, None)]
        live &= ~ended
        n_live -= int(ended.sum())
        if n_live == 0:
            break
        if live.numel() - n_live >= COMPACT_AT * live.numel():
            keep = live.nonzero().squeeze(1)
            sent, max_len, total = sent[keep], max_len[keep], total[keep]
            tokens, tok_scores, live = tokens[keep], tok_scores[keep], live[keep]
            state = state.select_sentences(keep)
    return out


def _choose(probs: Tensor, at_max: Tensor | None) -> tuple[Tensor, Tensor]:
    """(token [N], its log-probability [N]) from probabilities [N, V] (an ensemble's): the
    most probable token, the smallest id among equal probabilities; only eos in the rows
    ``at_max``, with the model's own probability (floored)."""
    never_chosen(probs)
    if at_max is not None:
        eos_p = probs[at_max, EOS].clamp(min=1e-30)
        probs[at_max] = 0.0
        probs[at_max, EOS] = eos_p
    top, best = first_max(probs)
    return best, top.log()


def _choose_by_logits(logits: Tensor, at_max: Tensor | None,
                      scores: bool) -> tuple[Tensor, Tensor | None]:
    """(token [N], its log-probability [N] or None without ``scores``) from one model's
    logits [N, V]: the largest logit, the smallest id among equal ones, pad and bos never;
    only eos in the rows ``at_max``. The log-probability is the log of the token's float32
    softmax probability, as the ensemble's probabilities give it (floored for a forced eos)."""
    probs = F.softmax(logits, dim=-1, dtype=torch.float32) if scores else None
    never_chosen(logits, float("-inf"))
    best = first_max(logits)[1]
    if at_max is not None:
        best = best.masked_fill(at_max, EOS)
    if probs is None:
        return best, None
    never_chosen(probs)
    p = probs.gather(1, best.unsqueeze(1)).squeeze(1)
    if at_max is not None:
        p = torch.where(at_max, p.clamp(min=1e-30), p)
    return best, p.log()


__all__ = ["applies", "greedy_search"]
