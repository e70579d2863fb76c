"""The beam step policy: which candidates a beam keeps, scores in, choices out (no model, no state).

Ties are broken by the smaller flat index (beam-major, then token id) everywhere, so a choice
never depends on the top-k algorithm, the batch size or the device.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nmt.specials import BOS, PAD


def topk_stable(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top-``k`` of each row of ``x`` [N, M], sorted by (value descending, index ascending).

    ``torch.topk`` leaves the order (and, at the k-th place, the choice) among equal values
    unspecified. We ask for k+1 values and re-sort them stably by index. Where the k-th and
    (k+1)-th values are equal and finite (a tie across the boundary, common with bf16 models),
    the tied elements with the smallest indices are looked up in the row itself; ties among
    -inf/zero-probability candidates never matter, they are discarded.
    Returns values and indices [N, min(k, M)].
    """
    m = x.size(1)
    k = min(k, m)
    kk = min(k + 1, m)
    vals, idx = _topk_unordered(x, kk)                           # [N, kk]
    vals, idx = _sort_by_value_then_index(vals, idx)
    if kk > k:
        tie = (vals[:, k] == vals[:, k - 1]) & (vals[:, k - 1] > float("-inf"))
        vals, idx = vals[:, :k], idx[:, :k]
        if bool(tie.any()):
            rows = tie.nonzero().squeeze(1)
            v, i = _resolve_ties(x.index_select(0, rows), vals[rows], idx[rows], k)
            vals, idx = vals.clone(), idx.clone()
            vals[rows], idx[rows] = v, i
    return vals, idx


CHUNK = 64      # elements per chunk of the two-level top-k


def _topk_unordered(x: Tensor, kk: int) -> tuple[Tensor, Tensor]:
    """The ``kk`` largest values of each row of ``x`` [N, M] and their indices, exact, in no
    particular order.

    torch.topk over a 10k-32k vocabulary is several times slower than a vectorised max, so for
    wide rows we take the max of every chunk of CHUNK elements, keep the ``kk`` chunks with the
    largest maxima, and run top-k over those chunks only. Exact: each kept chunk holds an
    element >= the kk-th largest chunk maximum tau, so the kk-th largest element is >= tau, and
    every element of a dropped chunk is < tau, unless chunk maxima tie at tau; such rows (rare:
    e.g. rows of zeros) use the plain top-k.
    """
    n, m = x.shape
    n_chunks = m // CHUNK
    if n_chunks < 4 * kk or not x.is_contiguous():
        return x.topk(kk, dim=1, sorted=False)
    main = x[:, :n_chunks * CHUNK].view(n, n_chunks, CHUNK)
    cmax = main.amax(dim=2)                                        # [N, chunks]
    ctop, cidx = cmax.topk(kk + 1, dim=1)                          # [N, kk+1] descending
    pos = (cidx[:, :kk].unsqueeze(2) * CHUNK
           + torch.arange(CHUNK, device=x.device)).reshape(n, kk * CHUNK)
    if m > n_chunks * CHUNK:           # the last, partial chunk is always a candidate
        tail = torch.arange(n_chunks * CHUNK, m, device=x.device).expand(n, -1)
        pos = torch.cat([pos, tail], dim=1)
    vals, j = x.gather(1, pos).topk(kk, dim=1, sorted=False)
    idx = pos.gather(1, j)
    tie = ctop[:, kk - 1] == ctop[:, kk]
    if bool(tie.any()):
        rows = tie.nonzero().squeeze(1)
        v, i = x.index_select(0, rows).topk(kk, dim=1, sorted=False)
        vals, idx = vals.clone(), idx.clone()
        vals[rows], idx[rows] = v, i
    return vals, idx


def _sort_by_value_then_index(vals: Tensor, idx: Tensor) -> tuple[Tensor, Tensor]:
    idx, perm = idx.sort(dim=1)                                  # index ascending ...
    vals, perm2 = vals.gather(1, perm).sort(dim=1, descending=True, stable=True)
    return vals, idx.gather(1, perm2)                            # ... then value descending


def _resolve_ties(xr: Tensor, vals: Tensor, idx: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Exact top-k of rows ``xr`` [T, M] whose k-th value t is tied beyond the top-k: every
    element above t is already in ``vals``/``idx`` [T, k]; add the k smallest indices equal
    to t and keep the first k by (value desc, index asc)."""
    m = xr.size(1)
    t = vals[:, k - 1:k]                                          # [T, 1]
    pos = torch.arange(m, device=xr.device)
    tied = torch.where(xr == t, pos, m).topk(k, dim=1, largest=False).values   # [T, k]
    above = vals > t
    neg = torch.full_like(vals, float("-inf"))
    cand_v = torch.cat([torch.where(above, vals, neg),
                        torch.where(tied < m, t.expand(-1, k), neg)], dim=1)
    cand_i = torch.cat([torch.where(above, idx, m), tied], dim=1)
    v, i = _sort_by_value_then_index(cand_v, cand_i)
    return v[:, :k], i[:, :k]


def never_chosen(probs: Tensor, value: float = 0.0) -> None:
    """Set, in place, the probabilities (or logits: ``value`` -inf) of pad and bos [N, V] to
    ``value``: never predicted. One slice when their ids are adjacent (as nmt's are), not two
    indexed writes per step."""
    lo, hi = min(PAD, BOS), max(PAD, BOS)
    if hi == lo + 1:
        probs[:, lo:hi + 1].fill_(value)
    else:
        probs[:, PAD] = value
        probs[:, BOS] = value


def first_max(x: Tensor, chunk: int = 128) -> tuple[Tensor, Tensor]:
    """The maximum of each row of ``x`` [N, M] and the index of its first occurrence, [N]
    each: what ``x.max(dim=1)`` returns (NaN counting as the maximum), 3-6 times faster for
    rows of thousands of elements on a CPU, where torch's max with indices is a scalar loop
    and its max without them is vectorised: the chunks of ``chunk`` elements are reduced
    without indices, and indices are sought only in the first chunk holding the maximum."""
    n, m = x.shape
    c = m // chunk
    if c < 2 or not x.is_contiguous():
        return x.max(dim=1)
    main = x[:, :c * chunk].view(n, c, chunk)
    _, where = main.amax(dim=2).max(dim=1)                       # first chunk with the max
    top, idx = main[torch.arange(n, device=x.device), where].max(dim=1)
    idx = idx + where * chunk
    if m > c * chunk:                                            # the last, partial chunk
        t_top, t_idx = x[:, c * chunk:].max(dim=1)
        later = (t_top > top) | (t_top.isnan() & ~top.isnan())
        top, idx = torch.where(later, t_top, top), torch.where(later, t_idx + c * chunk, idx)
    return top, idx


def beam_candidates(probs: Tensor, scores: Tensor, n_cand: int
                    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Best ``n_cand`` one-token extensions of each sentence's beam.

    probs [N, K, V]: next-token probabilities of each beam row (pad/bos already zeroed);
    scores [N, K]: cumulative log-probabilities (-inf for dead rows). Returns, each [N, C] with
    C = min(n_cand, K * min(n_cand, V)), sorted best first (ties: smaller beam, then smaller
    token id): cumulative scores, beam of origin, token, and that token's log-prob.

    Within one row every extension adds the same score, so a sentence's best ``n_cand``
    extensions are among its rows' best ``n_cand`` tokens: one top-k over the vocabulary per row
    and a small sort of K * n_cand candidates, instead of log-probs and a top-k over K * V
    values. The log is only taken of the candidates (float32 probabilities carry the same
    precision as log-probabilities down to ~1e-38).
    """
    n, k, v = probs.shape
    top_p, top_tok = topk_stable(probs.reshape(n * k, v), n_cand)      # [N*K, c] each
    c = top_p.size(1)
    top_lp = top_p.log().reshape(n, k * c)                               # [N, K*c]
    total = scores.unsqueeze(2).expand(n, k, c).reshape(n, k * c) + top_lp
    beams = torch.arange(k, device=probs.device).repeat_interleave(c).expand(n, k * c)
    tokens = top_tok.reshape(n, k * c)
    # Sort by (score desc, beam * V + token asc): first by the key, then stably by score.
    perm = (beams * v + tokens).argsort(dim=1)
    total, tokens, beams, top_lp = (x.gather(1, perm) for x in (total, tokens, beams, top_lp))
    total, order = total.sort(dim=1, descending=True, stable=True)
    order = order[:, :n_cand]
    return (total[:, :n_cand], beams.gather(1, order), tokens.gather(1, order),
            top_lp.gather(1, order))


def split_candidates(cand_scores: Tensor, cand_tokens: Tensor, eos: int, beam: int
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """Split sorted candidates [N, C] into finished hypotheses and the next beam.

    - finished: eos candidates among the first ``beam`` (fairseq's policy: an eos ranked below
      the beam would not have survived in it, so it does not count as found);
    - next beam: the first ``beam`` candidates that do not end in eos, in order.
    Returns ``finished`` [N, min(beam, C)] bool, ``pos`` [N, beam] (candidate positions of the
    next beam) and ``alive`` [N, beam] (False where fewer than ``beam`` live candidates exist:
    that row is dead and carries score -inf).
    """
    n, c = cand_scores.shape
    valid = torch.isfinite(cand_scores)
    is_eos = cand_tokens.eq(eos)
    finished = (is_eos & valid)[:, :beam]
    live = valid & ~is_eos
    # Live candidates first, each group in candidate order: the key is unique per row.
    key = (~live).long() * c + torch.arange(c, device=cand_scores.device)
    pos = key.sort(dim=1).indices[:, :beam]
    if pos.size(1) < beam:                  # fewer candidates than beams (tiny vocabularies)
        pos = torch.cat([pos, pos[:, -1:].expand(n, beam - pos.size(1))], dim=1)
        alive = live.gather(1, pos)
        alive[:, c:] = False
    else:
        alive = live.gather(1, pos)
    return finished, pos, alive


def diverse_candidates(probs: Tensor, scores: Tensor, groups: int, strength: float, eos: int
                       ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Diverse beam search's step (Vijayakumar et al. 2018, "Diverse Beam Search", with
    Hamming diversity; fairseq's --diverse-beam-groups/-strength): the K rows of a sentence
    form ``groups`` groups of K/G consecutive rows, each a beam of its own. Group g chooses
    after groups 0..g-1, each of its tokens' log-probabilities lowered by ``strength`` times
    the number of rows of earlier groups that chose that token at this step.

    The penalty steers the choice only: the scores returned (and the hypotheses' scores) are
    the model's log-probabilities. probs [N, K, V], scores [N, K]. Returns, each [N, 2K] (group
    g's 2K/G candidates at columns g*2K/G..., its own beam order): cumulative scores, beam of
    origin (a row of the whole beam), token and its log-prob; then ``finished`` [N, 2K] (eos
    candidates among the first K/G of their group), ``pos`` [N, K] (candidate columns of the
    next beam, group g's rows from its own candidates) and ``alive`` [N, K]."""
    n, k, v = probs.shape
    kg = k // groups
    chosen = torch.zeros(n, v, dtype=probs.dtype, device=probs.device)
    parts: list[list[Tensor]] = [[] for _ in range(7)]
    for g in range(groups):
        rows = slice(g * kg, (g + 1) * kg)
        p = probs[:, rows]
        if g and strength:
            p = p * torch.exp(-strength * chosen).unsqueeze(1)
        c_scores, c_beams, c_tokens, c_lprobs = beam_candidates(p, scores[:, rows], 2 * kg)
        if g and strength:      # back to the model's own log-probabilities
            back = strength * chosen.gather(1, c_tokens)
            c_scores, c_lprobs = c_scores + back, c_lprobs + back
        fin, pos, alive = split_candidates(c_scores, c_tokens, eos, kg)
        width = c_scores.size(1)
        fin = torch.cat([fin, fin.new_zeros(n, width - fin.size(1))], dim=1)
        kept = c_tokens.gather(1, pos)
        chosen.scatter_add_(1, kept, alive.to(chosen.dtype))
        for out, x in zip(parts, (c_scores, c_beams + g * kg, c_tokens, c_lprobs, fin,
                                  pos + g * width, alive)):
            out.append(x)
    return tuple(torch.cat(x, dim=1) for x in parts)  # type: ignore[return-value]


__all__ = ["never_chosen", "first_max", "topk_stable", "beam_candidates", "split_candidates",
           "diverse_candidates"]
