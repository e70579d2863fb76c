"""Batched beam search with an incremental decoder: the generation loop and its bookkeeping.

Rows are sentence-major (row ``b * beam + k``, as nmt.models.state). Per step, for the N
sentences still running:

1. one decoder step for all N*beam rows (the KV cache grows by one position);
2. the beam policy (nmt.search.beam) picks the 2*beam best extensions per sentence;
3. eos candidates among the first ``beam`` become finished hypotheses, scored
   log P(Y) / lp(|Y|) (nmt.search.length_penalty); the next beam is the first ``beam``
   non-eos candidates;
4. the running sentences reorder their cache rows (``state.reorder``); where some finished,
   those leave the batch in the same copy (``state.select_sentences(keep, rows)``).

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
from nmt.search.beam import (beam_candidates, diverse_candidates, never_chosen,
                             split_candidates)
from nmt.search.config import MAX_LEN_B_MAX, SearchConfig  # noqa: F401 (SearchConfig re-exported)
from nmt.search.controls import DecodingControls, combine
from nmt.search.ensemble import select_and_reorder
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
                constraints=None, scores: bool = True) -> list[list[Hypothesis]]:
    """Translate a batch: src_tokens [B, S] (right-padded, each row ending in eos). ``model``
    is an nmt.search.ensemble.EnsembleModel (or anything with its encode / init_state / step /
    max_positions); ``cfg`` is resolved (``SearchConfig.resolve``). Returns, per sentence, its
    ``cfg.nbest`` best hypotheses, best first (ties: the one found first). ``constraints``:
    see the module doc. ``scores=False``: the caller needs no scores; greedy search of one
    model then computes none (each hypothesis's score and token scores are None)."""
    if unset := [k for k in cfg.unset if k not in MAY_BE_UNSET]:
        raise ValueError(f"beam_search needs a resolved SearchConfig ({', '.join(unset)} "
                         f"unset): use cfg.resolve(model_config)")
    device = src_tokens.device
    bsz, k = src_tokens.size(0), cfg.beam
    src_lengths = src_tokens.ne(PAD).sum(1) - 1                     # [B] without eos
    max_len = max_lengths(src_lengths, cfg, model.max_positions)    # [B]
    if greedy.applies(cfg, constraints):        # beam 1 stopping at the first eos
        return [[Hypothesis(*h) for h in hyps]
                for hyps in greedy.greedy_search(model, src_tokens, cfg, max_len, scores)]
    n_steps = int(max_len.max()) + 1

    # All beams start from bos: step 0 decodes a row per sentence, ``expand`` gives it k rows.
    state = model.init_state(model.encode(src_tokens), group=1)
    constraints = combine(DecodingControls.from_search(cfg), constraints)
    cstate = None if constraints is None else constraints.start(src_tokens, k, max_len)
    run = _Running.start(bsz, k, n_steps, max_len, cfg.diverse_beam_groups, model.start_token,
                         device)
    finished: list[list[tuple[float, list[int], list[float]]]] = [[] for _ in range(bsz)]
    penalty = (cfg.lenpen, cfg.formula)

    for step in range(n_steps):
        n = run.sent.numel()
        probs, state = _decoder_step(model, run.tokens, state, step, k)    # [N*K, V]
        vocab = probs.size(1)
        restrict(probs, step, run.max_len, k, cstate,
                 forced_eos_p=1.0 if cfg.formula == "hf" else None)

        cands = _candidates(probs.view(n, k, vocab), run.scores, cfg, cstate)
        if bool(cands.fin.any()):
            run.collect_finished(finished, cands, step, penalty, cfg.nbest)

        # The next beam: [N, K] each.
        nxt = _Beam(*(c.gather(1, cands.pos) for c in (cands.beams, cands.tokens,
                                                       cands.lprobs, cands.scores)))
        nxt.scores = nxt.scores.masked_fill(~cands.alive, NEG_INF)
        done = _sentences_done(nxt.scores, cands.alive, run, step, k, cfg.nbest, penalty,
                               cfg.unkpen < 0)                                       # [N]
        rows = (torch.arange(n, device=device) * k).unsqueeze(1) + nxt.beams   # [N, K] old rows
        if bool(done.any()):
            if bool(done.all()):
                break
            keep = (~done).nonzero().squeeze(1)                        # [N']
            rows, nxt = rows[keep], nxt.select(keep)
            run.select_sentences(keep)
            # dropping the finished sentences and reordering the beams: one copy of the cache
            state = select_and_reorder(state, keep, rows.reshape(-1))
        else:
            state = state.reorder(rows.reshape(-1))
        flat = rows.reshape(-1)
        run.extend(flat, nxt, step)
        if cstate is not None:
            cstate = cstate.advance(flat, run.tokens[:, step + 1])

    return _best_hypotheses(finished, cfg.nbest)


@dataclass
class _Candidates:
    """A step's candidates per running sentence, [N, C] each (scores, the beam each extends,
    its token, the token's log-probability), which of them end with eos (``fin``), the
    candidate positions of the next beam (``pos``, [N, K]) and whether each of its rows is
    alive ([N, K]); nmt.search.beam."""
    scores: Tensor
    beams: Tensor
    tokens: Tensor
    lprobs: Tensor
    fin: Tensor
    pos: Tensor
    alive: Tensor


@dataclass
class _Beam:
    """The next beam, [N, K] each: the row of the current beam each extends, its new token,
    the token's log-probability, the prefix's log-probability."""
    beams: Tensor
    tokens: Tensor
    lprobs: Tensor
    scores: Tensor

    def select(self, keep: Tensor) -> "_Beam":
        return _Beam(self.beams[keep], self.tokens[keep], self.lprobs[keep], self.scores[keep])


@dataclass
class _Running:
    """What the search keeps between steps for the N sentences still running (K rows each,
    sentence-major)."""
    sent: Tensor          # [N] index in the batch
    max_len: Tensor       # [N] most tokens before eos
    n_fin: Tensor         # [N] finished hypotheses so far
    kth_best: Tensor      # [N] the nbest-th best finished score
    worst_kept: Tensor    # [N] the beam-th best finished score (the hf rule)
    scores: Tensor        # [N, K] log P(prefix) of each row
    tokens: Tensor        # [N*K, 1 + steps] bos, then the tokens so far
    tok_scores: Tensor    # [N*K, steps] the log-probability of each

    @classmethod
    def start(cls, bsz: int, k: int, n_steps: int, max_len: Tensor, groups: int,
              start_token: int, device) -> "_Running":
        tokens = torch.full((bsz * k, n_steps + 1), PAD, dtype=torch.long, device=device)
        tokens[:, 0] = start_token
        scores = torch.full((bsz, k), NEG_INF, device=device)
        scores[:, ::k // groups] = 0.0      # one live row per sentence (or diverse group)
        return cls(sent=torch.arange(bsz, device=device), max_len=max_len,
                   n_fin=torch.zeros(bsz, dtype=torch.long, device=device),
                   kth_best=torch.full((bsz,), NEG_INF, device=device),
                   worst_kept=torch.full((bsz,), NEG_INF, device=device),
                   scores=scores, tokens=tokens,
                   tok_scores=torch.zeros(bsz * k, n_steps, device=device))

    def select_sentences(self, keep: Tensor) -> None:
        """Keep the sentences ``keep`` [N'] (their rows follow in extend())."""
        self.sent, self.max_len, self.n_fin = self.sent[keep], self.max_len[keep], self.n_fin[keep]
        self.kth_best, self.worst_kept = self.kth_best[keep], self.worst_kept[keep]

    def extend(self, rows: Tensor, nxt: _Beam, step: int) -> None:
        """The rows of the next beam: old row ``rows[i]`` extended with its token."""
        self.tokens = self.tokens.index_select(0, rows)
        self.tok_scores = self.tok_scores.index_select(0, rows)
        self.tokens[:, step + 1] = nxt.tokens.reshape(-1)
        self.tok_scores[:, step] = nxt.lprobs.reshape(-1)
        self.scores = nxt.scores

    def collect_finished(self, finished, cands: _Candidates, step: int,
                         penalty: tuple[float, str], nbest: int) -> None:
        """Store the eos candidates ``cands.fin`` [N, <=K] as finished hypotheses of length
        step + 1, scored with ``penalty`` (alpha, formula); update ``n_fin``, ``kth_best``
        and ``worst_kept``. Gathers everything with tensor ops and crosses into Python once
        per step."""
        k = self.scores.size(1)
        fi, fj = cands.fin.nonzero(as_tuple=True)                        # [F] each
        rows = fi * k + cands.beams[fi, fj]                              # [F] rows they extend
        norm = cands.scores[fi, fj] / length_penalty(step + 1, *penalty)  # [F] |Y| = step + 1
        prefix = self.tokens[rows, 1:step + 1].tolist()
        prefix_scores = self.tok_scores[rows, :step].tolist()
        eos_lp = cands.lprobs[fi, fj].tolist()
        sent_ids = self.sent.tolist()
        touched: dict[int, None] = {}
        for i, s, toks, ts, e in zip(fi.tolist(), norm.tolist(), prefix, prefix_scores, eos_lp):
            finished[sent_ids[i]].append((s, toks + [EOS], ts + [e]))
            touched[i] = None
        # one write per tensor for every sentence touched, not one per sentence and tensor
        counts, kth, worst = [], [], []
        for i in touched:
            ranked = sorted((h[0] for h in finished[sent_ids[i]]), reverse=True)
            counts.append(len(ranked))
            kth.append(ranked[nbest - 1] if len(ranked) >= nbest else NEG_INF)
            worst.append(ranked[k - 1] if len(ranked) >= k else NEG_INF)
        at = torch.tensor(list(touched), device=self.n_fin.device)
        self.n_fin[at] = torch.tensor(counts, device=at.device)
        self.kth_best[at] = torch.tensor(kth, dtype=self.kth_best.dtype, device=at.device)
        self.worst_kept[at] = torch.tensor(worst, dtype=self.worst_kept.dtype, device=at.device)


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
        return _Candidates(*select(probs, scores))
    if cfg.diverse_beam_groups > 1:
        return _Candidates(*diverse_candidates(probs, scores, cfg.diverse_beam_groups,
                                               cfg.diverse_beam_strength, EOS))
    c_scores, c_beams, c_tokens, c_lprobs = beam_candidates(probs, scores, 2 * k)
    return _Candidates(c_scores, c_beams, c_tokens, c_lprobs,
                       *split_candidates(c_scores, c_tokens, EOS, k))


def _sentences_done(new_scores: Tensor, alive: Tensor, run: _Running, step: int, k: int,
                    nbest: int, penalty: tuple[float, str], can_rise: bool = False) -> Tensor:
    """[N] True where a sentence's search is over: enough finished (with the hf rule, and no
    live hypothesis beats the beam-th best finished at its length, |Y| = step + 1, as
    transformers decides), or none of the live ones can win any more, or none is live.
    ``run`` holds the finished counts and the nbest-th and beam-th best finished scores.
    ``can_rise``: a negative unkpen multiplies <unk>'s probability by more than 1, so a live
    score may still grow and no bound holds: only enough finished hypotheses, or none live,
    end it."""
    alpha, formula = penalty
    # The best live score: the first row's, as rows are sorted, except with diverse groups.
    best_live = new_scores.amax(dim=1)                                           # [N]
    bound = best_possible_score(best_live, run.max_len + 1, alpha, formula)      # [N]
    enough = run.n_fin >= k
    if formula == "hf":
        enough &= best_live / length_penalty(step + 1, alpha, formula) <= run.worst_kept
    beaten = (run.n_fin >= nbest) & (bound <= run.kth_best) & (not can_rise)
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
    never_chosen(probs)             # pad and bos
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


__all__ = ["SearchConfig", "Hypothesis", "beam_search", "max_lengths"]
