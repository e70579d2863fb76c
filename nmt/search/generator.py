"""Batched beam search with an incremental decoder: the generation loop and its bookkeeping.

Rows are sentence-major (row ``b * beam + k``, as nmt.models.state). Per step, for the N
sentences still running:

1. one decoder step for all N*beam rows (the KV cache grows by one position);
2. the beam policy (nmt.search.beam) picks the 2*beam best extensions per sentence;
3. eos candidates among the first ``beam`` become finished hypotheses, scored
   log P(Y) / lp(|Y|) (nmt.search.length_penalty); the next beam is the first ``beam``
   non-eos candidates;
4. finished sentences leave the batch (``state.select_sentences``), the others reorder their
   cache rows (``state.reorder``).

The first step runs once per sentence (all its beams start from bos alone) and
``state.expand(beam)`` then copies that row to the sentence's ``beam`` rows.

When is a sentence done? As soon as one of these holds:

- it has ``beam`` finished hypotheses (fairseq's rule; with beam 1 this makes beam search
  exactly greedy decoding: it stops at the first eos). With ``lenpen_formula`` "hf",
  transformers' rule instead (its beam search with early_stopping=False): ``beam`` finished
  hypotheses, and the best live one, normalized at its current length, scoring no better
  than the worst of the ``beam`` best finished ones (and, as its forced_eos_token_id, the
  eos forced at the length limit scores log-probability 0);
- it has ``nbest`` finished hypotheses and no unfinished one can still beat the nbest-th best of
  them: an unfinished hypothesis with log-probability s can at best reach s / lp(max_len + 1)
  (log-probabilities only decrease and, s being <= 0, dividing by the largest lp gives the
  largest value; see ``best_possible_score``). This is the paper's (tensor2tensor's) rule; it
  never changes the result, it only stops earlier;
- it has reached its maximum length: at step ``max_len`` only eos is allowed, so every live
  hypothesis finishes with at most ``max_len`` tokens before its eos, where
  ``max_len = floor(a * source_length + b)`` (source length in subwords, without eos), capped
  so that the decoder never needs more positions than the model has.

Constraints (optional ``constraints=`` of :func:`beam_search`, e.g.
nmt.search.constraints.TreeConstraints for linearized trees) restrict what each row may emit:
``constraints.start(src_tokens, beam, max_len)`` gives a state whose ``restrict(probs, step)``
zeroes the forbidden tokens of ``probs`` [N*K, V] in place (before the forced eos) and whose
``advance(rows, tokens)`` returns the state of the next beam (new row i extends old row
``rows[i]`` with ``tokens[i]``; sentences that left the batch are gone from ``rows``). A state
with a ``select(probs, scores)`` method also chooses the step's candidates itself, in place of
step 2-3 (nmt.search.lexical: dynamic beam allocation).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from nmt.errors import UsageError
from nmt.search import greedy
from nmt.search.beam import beam_candidates, diverse_candidates, split_candidates
from nmt.search.config import MAX_LEN_B_MAX, SearchConfig  # noqa: F401 (SearchConfig re-exported)
from nmt.search.controls import DecodingControls, combine
from nmt.search.length_penalty import best_possible_score, length_penalty

from nmt.specials import BOS, EOS, PAD  # noqa: F401 (re-exported)
NEG_INF = float("-inf")


@dataclass
class Hypothesis:
    tokens: list[int]                 # generated ids, ending with eos
    score: float                      # log P(Y|X) / lp(|Y|), what the beam ranks by
    token_scores: list[float] = field(default_factory=list)   # log-prob of each token

    @property
    def log_prob(self) -> float:
        return float(sum(self.token_scores))


# Preset fields beam_search takes unset: the GNMT formula, no minimum length (as configs
# written before these fields existed decode; SearchConfig.formula and .minimum).
MAY_BE_UNSET = ("lenpen_formula", "min_len")


def max_lengths(src_lengths: Tensor, cfg: SearchConfig, max_positions: int | None) -> Tensor:
    """[B] most tokens before eos: floor(a * len + b), capped by the decoder's positions.

    The decoder reads bos + max_len tokens (positions 0 .. max_len) to predict the forced eos.
    """
    top = float(MAX_LEN_B_MAX if max_positions is None else max_positions - 1)
    # clamped while still a float: a huge a * len + b would not survive the cast to int64
    return torch.floor(cfg.max_len_a * src_lengths.double() + cfg.max_len_b).clamp(0, top).long()


@torch.inference_mode()
def beam_search(model, src_tokens: Tensor, cfg: SearchConfig,
                constraints=None) -> list[list[Hypothesis]]:
    """Translate a batch: src_tokens [B, S] (right-padded, each row ending in eos). ``model``
    is an nmt.search.ensemble.EnsembleModel (or anything with its encode / init_state / step /
    max_positions); ``cfg`` is resolved (``SearchConfig.resolve``). Returns, per sentence, its
    ``cfg.nbest`` best hypotheses, best first (ties: the one found first). ``constraints``:
    see the module doc."""
    if unset := [k for k in cfg.unset if k not in MAY_BE_UNSET]:
        raise ValueError(f"beam_search needs a resolved SearchConfig ({', '.join(unset)} "
                         f"unset): use cfg.resolve(model_config)")
    device = src_tokens.device
    bsz, k = src_tokens.size(0), cfg.beam
    alpha, formula = cfg.lenpen, cfg.formula
    src_lengths = src_tokens.ne(PAD).sum(1) - 1                     # [B] without eos
    max_len = max_lengths(src_lengths, cfg, model.max_positions)    # [B]
    if greedy.applies(cfg, constraints):        # beam 1 stopping at the first eos
        return [[Hypothesis(*h) for h in hyps]
                for hyps in greedy.greedy_search(model, src_tokens, cfg, max_len)]
    n_steps = int(max_len.max()) + 1

    # All beams start from bos: step 0 decodes a row per sentence, ``expand`` gives it k rows.
    state = model.init_state(model.encode(src_tokens), group=1)
    constraints = combine(DecodingControls.from_search(cfg), constraints)
    cstate = None if constraints is None else constraints.start(src_tokens, k, max_len)
    # Per running sentence (N of them; sentence-major rows):
    sent = torch.arange(bsz, device=device)                         # [N] index in the batch
    tokens = torch.full((bsz * k, n_steps + 1), PAD, dtype=torch.long, device=device)
    tokens[:, 0] = model.start_token                                # [N*K, 1 + steps]
    tok_scores = torch.zeros(bsz * k, n_steps, device=device)       # [N*K, steps]
    scores = torch.full((bsz, k), NEG_INF, device=device)           # [N, K] log P(prefix)
    scores[:, ::k // cfg.diverse_beam_groups] = 0.0  # one live row per sentence (or group)
    n_fin = torch.zeros(bsz, dtype=torch.long, device=device)       # [N] finished so far
    kth_best = torch.full((bsz,), NEG_INF, device=device)           # [N] nbest-th best score
    worst_kept = torch.full((bsz,), NEG_INF, device=device)         # [N] beam-th best (hf)
    finished: list[list[tuple[float, list[int], list[float]]]] = [[] for _ in range(bsz)]

    for step in range(n_steps):
        n = sent.numel()
        probs, state = _decoder_step(model, tokens, state, step, k)    # [N*K, V]
        vocab = probs.size(1)
        restrict(probs, step, max_len, k, cstate, forced_eos_p=1.0 if formula == "hf" else None)

        c_scores, c_beams, c_tokens, c_lprobs, fin, pos, alive = _candidates(
            probs.view(n, k, vocab), scores, cfg, cstate)              # each [N, C] or [N, K]

        if bool(fin.any()):
            _collect_finished(finished, fin, sent, c_scores, c_beams, c_lprobs, tokens,
                              tok_scores, step, k, (alpha, formula), n_fin,
                              {cfg.nbest: kth_best, k: worst_kept})

        # The next beam: [N, K] each.
        new_beams, new_tokens, new_lprobs, new_scores = (
            c.gather(1, pos) for c in (c_beams, c_tokens, c_lprobs, c_scores))
        new_scores = new_scores.masked_fill(~alive, NEG_INF)

        done = _sentences_done(new_scores, alive, max_len, step, n_fin, (kth_best, worst_kept),
                               k, cfg.nbest, (alpha, formula), cfg.unkpen < 0)  # [N]
        rows = (torch.arange(n, device=device) * k).unsqueeze(1) + new_beams   # [N, K] old rows
        if bool(done.any()):
            if bool(done.all()):
                break
            keep = (~done).nonzero().squeeze(1)                        # [N']
            (rows, new_beams, new_tokens, new_lprobs, new_scores, sent, max_len, n_fin, kth_best,
             worst_kept) = (t[keep] for t in (rows, new_beams, new_tokens, new_lprobs, new_scores,
                                              sent, max_len, n_fin, kth_best, worst_kept))
            state = state.select_sentences(keep)
            local = (torch.arange(keep.numel(), device=device) * k).unsqueeze(1) + new_beams
        else:
            local = rows
        state = state.reorder(local.reshape(-1))
        flat = rows.reshape(-1)
        tokens = tokens.index_select(0, flat)
        tok_scores = tok_scores.index_select(0, flat)
        tokens[:, step + 1] = new_tokens.reshape(-1)
        tok_scores[:, step] = new_lprobs.reshape(-1)
        scores = new_scores
        if cstate is not None:
            cstate = cstate.advance(flat, tokens[:, step + 1])

    return _best_hypotheses(finished, cfg.nbest)


def _candidates(probs: Tensor, scores: Tensor, cfg: SearchConfig, cstate=None):
    """The step's candidates (scores, beams, tokens, log-probs), the finished ones among them,
    the candidate positions of the next beam and whether each of its rows is alive
    (nmt.search.beam): one beam, or ``cfg.diverse_beam_groups`` diverse groups, or the
    constraints state's own ``select(probs, scores)`` when it has one (lexical constraints:
    nmt.search.lexical)."""
    k = probs.size(1)
    select = getattr(cstate, "select", None)
    if select is not None:
        if cfg.diverse_beam_groups > 1:
            raise UsageError("diverse beam groups cannot choose their candidates where the "
                             "constraints choose them (lexical constraints)")
        return select(probs, scores)
    if cfg.diverse_beam_groups > 1:
        return diverse_candidates(probs, scores, cfg.diverse_beam_groups,
                                  cfg.diverse_beam_strength, EOS)
    c_scores, c_beams, c_tokens, c_lprobs = beam_candidates(probs, scores, 2 * k)
    return (c_scores, c_beams, c_tokens, c_lprobs,
            *split_candidates(c_scores, c_tokens, EOS, k))


def _sentences_done(new_scores: Tensor, alive: Tensor, max_len: Tensor, step: int,
                    n_fin: Tensor, bests: tuple[Tensor, Tensor], k: int, nbest: int,
                    penalty: tuple[float, str], can_rise: bool = False) -> Tensor:
    """[N] True where a sentence's search is over: enough finished (with the hf rule, and no
    live hypothesis beats the beam-th best finished at its length, |Y| = step + 1, as
    transformers decides), or none of the live ones can win any more, or none is live.
    ``bests``: the nbest-th and the beam-th best finished scores, [N] each. ``can_rise``: a
    negative unkpen multiplies <unk>'s probability by more than 1, so a live score may still
    grow and no bound holds: only enough finished hypotheses, or none live, end it."""
    (alpha, formula), (kth_best, worst_kept) = penalty, bests
    # The best live score: the first row's, as rows are sorted, except with diverse groups.
    best_live = new_scores.amax(dim=1)                                           # [N]
    bound = best_possible_score(best_live, max_len + 1, alpha, formula)          # [N]
    enough = n_fin >= k
    if formula == "hf":
        enough &= best_live / length_penalty(step + 1, alpha, formula) <= worst_kept
    beaten = (n_fin >= nbest) & (bound <= kth_best) & (not can_rise)
    return enough | beaten | ~alive.any(dim=1)


def _decoder_step(model, tokens: Tensor, state, step: int, k: int):
    """(probs [N*K, V], state) of the next token of every row; the first step decodes one row
    per sentence (its beams all start from the same prefix) and gives each sentence k rows."""
    if step == 0:
        probs, state = model.step(tokens[::k, :1], state)             # [N, V]
        return probs.repeat_interleave(k, dim=0), state.expand(k)
    return model.step(tokens[:, step:step + 1], state)


def _best_hypotheses(finished, nbest: int) -> list[list[Hypothesis]]:
    out: list[list[Hypothesis]] = []
    for hyps in finished:
        # Stable sort: among equal scores the hypothesis found first wins.
        hyps = sorted(hyps, key=lambda h: -h[0])[:nbest]
        out.append([Hypothesis(toks, score, ts) for score, toks, ts in hyps])
    return out


def restrict(probs: Tensor, step: int, max_len: Tensor, k: int, cstate,
              forced_eos_p: float | None = None) -> None:
    """Zero, in ``probs`` [N*K, V], what may not come next: pad and bos, what the constraints
    state ``cstate`` (if any) forbids, and all but eos for sentences at their maximum length.
    The forced eos keeps the model's probability, or gets ``forced_eos_p`` (transformers'
    forced_eos_token_id gives it log-probability 0: probability 1)."""
    probs[:, PAD] = 0.0             # never predicted
    probs[:, BOS] = 0.0
    at_max = max_len.eq(step)                                         # [N]
    forced = bool(at_max.any())
    # The model's eos probability, before constraints that may forbid eos here (a prefix or
    # a tree still unfinished at the limit, min_len beyond it)
    model_eos = probs[:, EOS].clone() if forced and cstate is not None else probs[:, EOS]
    if cstate is not None:
        cstate.restrict(probs, step)
    if forced:
        # Forced eos, keeping the model's own eos probability in the score (floored, so
        # that a model giving eos probability 0 still ends its hypotheses).
        rows = at_max.repeat_interleave(k)
        eos_p = model_eos[rows].clamp(min=1e-30) if forced_eos_p is None else forced_eos_p
        probs[rows] = 0.0
        probs[rows, EOS] = eos_p


def _collect_finished(finished, fin: Tensor, sent: Tensor, c_scores: Tensor, c_beams: Tensor,
                      c_lprobs: Tensor, tokens: Tensor, tok_scores: Tensor, step: int, k: int,
                      penalty: tuple[float, str], n_fin: Tensor, ranked: dict[int, Tensor]
                      ) -> None:
    """Store the eos candidates ``fin`` [N, <=K] as finished hypotheses of length step + 1,
    scored with ``penalty`` (alpha, formula).

    Gathers everything with tensor ops and crosses into Python once per step; updates in place
    the per-sentence counts ``n_fin`` and, for each ``n`` of ``ranked``, the n-th best finished
    scores ``ranked[n]`` [N].
    """
    fi, fj = fin.nonzero(as_tuple=True)                              # [F] each
    rows = fi * k + c_beams[fi, fj]                                  # [F] rows they extend
    norm = c_scores[fi, fj] / length_penalty(step + 1, *penalty)    # [F] |Y| = step + 1
    prefix = tokens[rows, 1:step + 1].tolist()
    prefix_scores = tok_scores[rows, :step].tolist()
    eos_lp = c_lprobs[fi, fj].tolist()
    sent_ids = sent.tolist()
    touched = set()
    for i, s, toks, ts, e in zip(fi.tolist(), norm.tolist(), prefix, prefix_scores, eos_lp):
        finished[sent_ids[i]].append((s, toks + [EOS], ts + [e]))
        touched.add(i)
    for i in touched:
        lst = finished[sent_ids[i]]
        n_fin[i] = len(lst)
        for n, best in ranked.items():
            if len(lst) >= n:
                best[i] = sorted((h[0] for h in lst), reverse=True)[n - 1]


__all__ = ["SearchConfig", "Hypothesis", "beam_search", "max_lengths"]
