"""Greedy decoding: the most probable next token of every row, until its eos.

Beam search with beam 1 decodes the same thing (it stops a sentence at its first eos, the
fairseq rule), through machinery that greedy decoding does not need: a top-2 per row and a
stable sort, the finished/live split, a reorder of the whole cache by the identity
permutation every step and index_selects of the token history. :func:`greedy_search` is that
search without them, and gives the very same hypotheses (tokens, token log-probabilities
and length-normalized scores, bit for bit), because it does the same arithmetic on the same
rows: the same float32 softmax of each row's logits, the first maximal probability (the
smallest token id among ties, as beam search's stable top-k), the same float32 sums of
log-probabilities and the same length penalty. One difference, by design: where two
probabilities differ by so little that their float32 sums with the prefix's score are equal,
beam search ranks the two candidates as tied and takes the smaller token id; greedy decoding
takes the more probable token. A float32 row's probabilities do not depend on the other
rows of its batch, so finished sentences need not leave it at once: they stay, decoded on
but ignored, until they are a quarter of the rows (COMPACT_AT), and then all leave in one copy
of the cache, instead of a copy at every step where one finishes.

It applies where beam search with beam 1 would stop at the first eos: one hypothesis, no
constraints or decoding controls, no diverse groups, and a length penalty other than
transformers' ("hf" may go on past a finished hypothesis). :func:`applies` says which.
"""

from __future__ import annotations

import torch
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
def greedy_search(model, src_tokens: Tensor, cfg, max_len: Tensor) -> list[list[tuple]]:
    """Translate src_tokens [B, S] greedily with ``model`` (nmt.search.ensemble.EnsembleModel);
    ``max_len`` [B]: the most tokens before eos (nmt.search.generator.max_lengths). Returns
    per sentence a list of one hypothesis (tokens, score, token log-probabilities), or none
    when every token had probability 0, as beam_search does with beam 1."""
    device = src_tokens.device
    bsz = src_tokens.size(0)
    n_steps = int(max_len.max()) + 1
    state = model.init_state(model.encode(src_tokens), group=1)
    sent = torch.arange(bsz, device=device)                          # [N] index in the batch
    tokens = torch.full((bsz, n_steps + 1), PAD, dtype=torch.long, device=device)
    tokens[:, 0] = model.start_token
    tok_scores = torch.zeros(bsz, n_steps, device=device)
    scores = torch.zeros(bsz, 1, device=device)                      # [N, 1] log P(prefix)
    out: list[list] = [[] for _ in range(bsz)]
    penalty = (cfg.lenpen, cfg.formula)

    live = torch.ones(bsz, dtype=torch.bool, device=device)         # [N] still decoding
    n_live = bsz
    for step in range(n_steps):
        probs, state = model.step(tokens[:, step:step + 1], state)  # [N, V] float32
        never_chosen(probs)
        at_max = max_len.eq(step)
        if bool(at_max.any()):
            # Only eos at the length limit, with the model's own probability (floored).
            eos_p = probs[at_max, EOS].clamp(min=1e-30)
            probs[at_max] = 0.0
            probs[at_max, EOS] = eos_p
        best, lp, scores = _choose(probs, scores)
        tokens[:, step + 1] = best[:, 0]
        tok_scores[:, step] = lp[:, 0]
        finite = torch.isfinite(scores[:, 0])
        ended = (best[:, 0].eq(EOS) | ~finite) & live                # eos, or probability 0
        if not bool(ended.any()):
            continue
        fin = (ended & finite).nonzero().squeeze(1)
        if fin.numel():
            norm = scores[fin, 0] / length_penalty(step + 1, *penalty)
            for i, s, toks, ts in zip(sent[fin].tolist(), norm.tolist(),
                                      tokens[fin, 1:step + 2].tolist(),
                                      tok_scores[fin, :step + 1].tolist()):
                out[i] = [(toks, s, ts)]
        live &= ~ended
        n_live -= int(ended.sum())
        if n_live == 0:
            break
        if live.numel() - n_live >= COMPACT_AT * live.numel():
            keep = live.nonzero().squeeze(1)
            sent, max_len, scores = sent[keep], max_len[keep], scores[keep]
            tokens, tok_scores, live = tokens[keep], tok_scores[keep], live[keep]
            state = state.select_sentences(keep)
    return out


def _choose(probs: Tensor, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(token [N, 1], its log-probability [N, 1], new scores [N, 1]): the most probable
    token, the smallest id among equal probabilities."""
    top, best = first_max(probs)
    lp = top.log().unsqueeze(1)
    return best.unsqueeze(1), lp, scores + lp


__all__ = ["applies", "greedy_search"]
