"""Sampling instead of beam search (back-translation, diverse outputs): each output token is
drawn from the model's distribution, optionally sharpened or flattened by a temperature and cut
to the ``topk`` most probable tokens and/or the smallest set holding ``topp`` of the mass.

Reproducible by construction: every output row draws its random numbers from its own
generator, seeded by (seed, line number, sample number), one number per step whatever the
other rows do. So the same seed gives the same output, and the output does not depend on the
batch size nor on which other lines are in the input (up to the float rounding of the model's
batched arithmetic). Hypotheses carry the model's own log-probabilities (not the
temperature-modified ones) and are scored as beam search scores them (length penalty
included); ``nbest`` samples per sentence are returned in the order they were drawn.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from nmt.errors import UsageError
from nmt.search.config import SamplingConfig, SearchConfig
from nmt.search.controls import DecodingControls, combine
from nmt.search.generator import Hypothesis, max_lengths
from nmt.search.generator import restrict as restrict_step
from nmt.search.length_penalty import length_penalty
from nmt.specials import EOS, PAD


def filter_distribution(probs: Tensor, cfg: SamplingConfig) -> Tensor:
    """The distribution to draw from: temperature, then top-k, then top-p (unnormalized)."""
    if cfg.temperature == 1.0:
        q = probs
    else:
        # relative to the most probable token, so that a tiny temperature cannot overflow the
        # division (it then keeps the top token alone: greedy search's)
        logp = probs.clamp(min=1e-30).log()
        logp = logp - logp.max(dim=1, keepdim=True).values
        q = logp.div(cfg.temperature).softmax(-1).masked_fill(probs.eq(0), 0.0)
    if cfg.topk and cfg.topk < q.size(1):
        # by position, not by value: tokens tied with the k-th would pass a value threshold
        keep = torch.zeros_like(q, dtype=torch.bool).scatter_(
            1, q.topk(cfg.topk, dim=1).indices, True)
        q = q.masked_fill(~keep, 0.0)
    if cfg.topp < 1.0:
        sorted_q, order = q.sort(dim=1, descending=True)
        mass = sorted_q.cumsum(1)
        total = mass[:, -1:]
        # keep a token while the mass before it is below topp (the first one always)
        drop_sorted = (mass - sorted_q) >= cfg.topp * total
        q = q.scatter(1, order, sorted_q.masked_fill(drop_sorted, 0.0))
    return q


@torch.inference_mode()
def sample(model, src_tokens: Tensor, search: SearchConfig, cfg: SamplingConfig,
           lines: Sequence[int], constraints=None) -> list[list[Hypothesis]]:
    """``search.nbest`` samples for each sentence of ``src_tokens`` [B, S] (right-padded,
    eos-terminated); ``lines[b]`` is sentence b's line number (part of its seed).
    ``constraints``: as beam search's (tree constraints, forced prefixes), applied to every
    sample row before it draws."""
    if search.diverse_beam_groups > 1:      # (nmt-generate and nmt-serve refuse it by name)
        raise UsageError("diverse beam groups are beam search's: they do not go with sampling")
    n, bsz = search.nbest, src_tokens.size(0)
    src_lengths = src_tokens.ne(PAD).sum(1) - 1
    max_len = max_lengths(src_lengths, search, model.max_positions)         # [B]
    rows = bsz * n
    rngs = [np.random.Generator(np.random.PCG64([cfg.seed, int(line), j]))
            for line in lines for j in range(n)]
    state = model.init_state(model.encode(src_tokens), group=n)
    constraints = combine(DecodingControls.from_search(search), constraints)
    cstate = None if constraints is None else constraints.start(src_tokens, n, max_len)
    if getattr(cstate, "select", None) is not None:
        raise UsageError("constraints that choose the beam's candidates themselves (lexical "
                         "constraints) cannot be sampled")
    prev = torch.full((rows, 1), model.start_token, dtype=torch.long,
                      device=src_tokens.device)
    out: list[list[int]] = [[] for _ in range(rows)]
    logp: list[list[float]] = [[] for _ in range(rows)]
    done = torch.zeros(rows, dtype=torch.bool, device=src_tokens.device)
    for step in range(int(max_len.max()) + 1):
        probs, state = model.step(prev, state)                      # [R, V]
        # What beam search may not emit either: pad, bos, anything but eos at the length limit.
        restrict_step(probs, step, max_len, n, cstate)
        q = filter_distribution(probs, cfg)
        cdf = q.cumsum(1)
        u = torch.tensor([r.random() for r in rngs], dtype=cdf.dtype, device=cdf.device)
        tok = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
        tok = tok.clamp(max=probs.size(1) - 1)
        tok = torch.where(q.gather(1, tok.unsqueeze(1)).squeeze(1) > 0, tok, q.argmax(1))
        lp = probs.gather(1, tok.unsqueeze(1)).squeeze(1).clamp(min=1e-30).log()
        tok_l, lp_l = tok.tolist(), lp.tolist()
        for r in (~done).nonzero().squeeze(1).tolist():
            out[r].append(tok_l[r])
            logp[r].append(lp_l[r])
        done |= tok.eq(EOS)
        if bool(done.all()):
            break
        prev = tok.unsqueeze(1)
        if cstate is not None:
            cstate = cstate.advance(torch.arange(rows, device=tok.device), tok)
    penalty = (search.lenpen, search.formula)
    hyps = [Hypothesis(toks, sum(ls) / float(length_penalty(len(toks), *penalty)), ls)
            for toks, ls in zip(out, logp)]
    return [hyps[b * n:(b + 1) * n] for b in range(bsz)]


__all__ = ["SamplingConfig", "sample", "filter_distribution"]
