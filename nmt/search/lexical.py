"""Lexically constrained decoding: every given phrase appears in the translation, found with
dynamic beam allocation (Post & Vilar 2018, "Fast Lexically Constrained Decoding with Dynamic
Beam Allocation"; fairseq's --constraints, Sockeye's constraints).

Each sentence has a few constraints, raw target text encoded with the checkpoint's own target
codec (:func:`encode_constraints`). A constraint is encoded as a text of its own, so with a
sentencepiece model it is spelled in its word-initial form (``▁Hund``), which is how the word
appears inside a sentence; a constraint the vocabulary cannot spell (``<unk>``) or that
encodes to nothing is refused in one line naming its line.

State, per beam row (sentence-major rows, as nmt.search.generator's): for each constraint, how
many of its tokens the output ends with (``prog``: the longest prefix of the constraint that is
a suffix of the output, tracked by a Knuth-Morris-Pratt automaton, so an occurrence is never
missed, e.g. "a a b" in "a a a b"), or its length once it has appeared (met, for good). Every
constraint is tracked on its own, so two that share a first token or overlap are both seen.
``need``: tokens still to emit to meet them all = the unmet constraints' lengths minus the
largest progress among them (finish that one, then the others one after the other).
``met tokens`` = all constraints' tokens minus ``need``.

``restrict`` (a constraints object of the generator, like nmt.search.prefix):

- eos is forbidden while a constraint is unmet;
- the length budget: with ``rem = max_len - step`` tokens left before the forced eos, a token
  after which ``need`` would exceed ``rem - 1`` is forbidden, so a row can always finish. Any
  token outside the constraints resets every progress, so all other tokens are forbidden as
  soon as the unmet constraints' lengths reach ``rem``; the allowed constraint tokens then
  keep at least probability FLOOR (a row never dies of the model finding them impossible).
  Every output therefore holds every constraint whenever they fit in the sentence's length
  limit (with a forced prefix: after it); the Translator refuses in one line a line whose
  constraints do not fit (:func:`check_room`).

``select`` (the generator's step, instead of the plain top-2k): the candidates of a sentence are
its usual best 2k extensions, plus, for each of its rows, the token that advances each unmet
constraint and the row's best token, each (row, token) once. They fall into banks by their met
tokens after the step; the next beam is filled round-robin from the highest bank down (each
bank gives its best remaining candidate in turn), so hypotheses that met more of the
constraints keep slots though they score lower. eos candidates among the first k of that
order finish (only a row with every constraint met may emit eos). Ties: smaller row, then
smaller token id, as everywhere in nmt.search.beam; a sentence's choice looks at its own rows
only, so it translates the same whatever its batch, and a sentence without constraints in a
batch with some gets exactly plain beam search's result. Scores stay the model's
log-probabilities. With beam 1 the search puts each constraint as early as it can (the highest
bank always wins): use a beam of 4 or more.

Refused (UsageError, one line): with tree constraints, diverse beam groups or sampling.
Combinable with forced prefixes and the controls of nmt.search.controls (combine()); when the
length limit leaves room for nothing but the constraints, their tokens are allowed even where
--no-repeat-ngram-size would ban them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from nmt.errors import NmtError, UsageError
from nmt.search.beam import beam_candidates, split_candidates
from nmt.search.constraints import FLOOR
from nmt.search.generator import max_lengths
from nmt.specials import EOS, PAD, UNK

NO_TOKEN = -2           # a token id matching nothing (constraint tables are padded with -1)


def encode_constraints(codec, texts: Sequence[str] | None, where: str) -> list[np.ndarray]:
    """Target ids of each constraint text (``where`` names its line in the error of one the
    vocabulary cannot spell or that encodes to nothing)."""
    out = []
    for i, text in enumerate(texts or ()):
        ids = np.asarray(codec.encode(text), dtype=np.int64)
        if ids.size == 0:
            raise NmtError(f"{where}: constraint {i + 1} ({text!r}) is empty once encoded")
        if bool((ids == UNK).any()):
            raise NmtError(f"{where}: constraint {i + 1} ({text!r}) cannot be spelled with the "
                           f"target vocabulary (encoded: "
                           f"{' '.join(codec.dictionary[int(t)] for t in ids)})")
        out.append(ids)
    return out


def check_room(constraints: Sequence[Sequence[int]], prefix_len: int, source_len: int, search,
               max_positions: int | None, where: str) -> None:
    """Refuse (NmtError) a forced prefix of ``prefix_len`` tokens and ``constraints`` (target
    ids) that together do not fit in the length limit of a source of ``source_len`` subwords.
    An empty source is not decoded (its translation is empty): nothing to check."""
    if not (constraints or prefix_len) or not source_len:
        return
    needed = sum(len(c) for c in constraints) + prefix_len
    limit = int(max_lengths(torch.tensor([source_len]), search, max_positions)[0])
    if needed > limit:
        what = ("its prefix and constraints need" if constraints and prefix_len
                else "its constraints need" if constraints else "its prefix needs")
        raise NmtError(f"{where}: {what} {needed} target tokens, more than the {limit} the "
                       f"length limit allows for its source (max_len_a * {source_len} + "
                       f"max_len_b)")


def refuse_with(search, sampling: bool, tree: bool) -> None:
    """UsageError where lexical constraints cannot go: sampling, diverse groups, trees."""
    if sampling:
        raise UsageError("lexical constraints need beam search: they do not go with sampling")
    if search.diverse_beam_groups > 1:
        raise UsageError("lexical constraints do not go with diverse beam groups")
    if tree:
        raise UsageError("lexical constraints cannot be combined with tree constraints "
                         "(use --no-tree-constraints)")


def automaton(ids: Sequence[int]) -> np.ndarray:
    """[n, n] Knuth-Morris-Pratt transitions of a constraint of n tokens: entry (p, j) is the
    progress after reading token ``ids[j]`` with progress p (< n); any other token gives 0."""
    n = len(ids)
    fail = [0] * n                          # longest proper border of ids[:p + 1]
    for p in range(1, n):
        q = fail[p - 1]
        while q and ids[p] != ids[q]:
            q = fail[q - 1]
        fail[p] = q + (ids[p] == ids[q])
    out = np.zeros((n, n), dtype=np.int64)
    for p in range(n):
        for j in range(n):
            q = p
            while q and ids[q] != ids[j]:
                q = fail[q - 1]
            out[p, j] = q + 1 if ids[q] == ids[j] else 0
    return out


class LexicalConstraints:
    """``constraints[b]``: the constraints (target ids, without eos) of the batch's sentence b,
    possibly none."""

    def __init__(self, constraints: Sequence[Sequence[Sequence[int] | np.ndarray]]):
        self.constraints = [[[int(t) for t in c] for c in cs] for cs in constraints]

    def start(self, src_tokens: Tensor, beam: int, max_len: Tensor) -> "LexicalState":
        if len(self.constraints) != src_tokens.size(0):
            raise ValueError(f"{len(self.constraints)} constraint lists for a batch of "
                             f"{src_tokens.size(0)} sentences")
        b = len(self.constraints)
        c = max(1, max(len(cs) for cs in self.constraints))
        n = max(1, max((len(x) for cs in self.constraints for x in cs), default=1))
        tokens = np.full((b, c, n), -1, dtype=np.int64)
        lens = np.zeros((b, c), dtype=np.int64)
        auto = np.zeros((b, c, n, n), dtype=np.int64)
        for i, cs in enumerate(self.constraints):
            for j, x in enumerate(cs):
                tokens[i, j, :len(x)], lens[i, j] = x, len(x)
                auto[i, j, :len(x), :len(x)] = automaton(x)
        dev = src_tokens.device
        tables = Tables(*(torch.from_numpy(a).to(dev) for a in (tokens, lens,
                                                                auto.reshape(b, c, n * n))))
        rows = torch.arange(b, device=dev).repeat_interleave(beam)
        return LexicalState(tables, rows, torch.zeros(b * beam, c, dtype=torch.long, device=dev),
                            max_len.repeat_interleave(beam))


@dataclass
class Tables:
    tokens: Tensor          # [B, C, L] each constraint's tokens, -1 after its end
    lens: Tensor            # [B, C] lengths (0: no such constraint, met from the start)
    auto: Tensor            # [B, C, L * L] the automata (:func:`automaton`), flattened

    def after(self, sent: Tensor, prog: Tensor, tok: Tensor) -> Tensor:
        """Progress [X, C] after rows of sentences ``sent`` [X] with progress ``prog`` emit
        ``tok`` [X]; met constraints stay met."""
        toks = self.tokens[sent]                                        # [X, C, L]
        width = toks.size(2)
        match = toks.eq(tok.view(-1, 1, 1))
        j = match.int().argmax(2)                  # where the token is (any place will do)
        p = prog.clamp(max=width - 1)
        new = self.auto[sent].gather(2, (p * width + j).unsqueeze(2)).squeeze(2)
        new = torch.where(match.any(2), new, 0)
        return torch.where(prog >= self.lens[sent], prog, new)

    def need(self, sent: Tensor, prog: Tensor) -> tuple[Tensor, Tensor]:
        """(need, unmet constraints' total length) [X] each, of progress ``prog`` [X, C]."""
        lens = self.lens[sent]
        unmet = prog < lens
        full = (lens * unmet).sum(1)
        return full - (prog * unmet).amax(1), full


@dataclass
class LexicalState:
    tables: Tables
    sent: Tensor            # [R] each row's sentence in the tables
    prog: Tensor            # [R, C] progress in each constraint (its length once met)
    max_len: Tensor         # [R] tokens allowed before eos

    def restrict(self, probs: Tensor, step: int) -> None:
        """No eos before every constraint is met; within the length budget (module doc)."""
        need, full = self.tables.need(self.sent, self.prog)
        open_ = need > 0
        if not bool(open_.any()):
            return
        probs[:, EOS].masked_fill_(open_, 0.0)
        tight = open_ & (full >= self.max_len - step)
        if not bool(tight.any()):
            return
        rows = tight.nonzero().squeeze(1)
        sent = self.sent[rows]
        cand = self.tables.tokens[sent].flatten(1)                      # [T, C*L]
        w = cand.size(1)
        after = self.tables.after(sent.repeat_interleave(w), self.prog[rows].repeat_interleave(
            w, 0), cand.reshape(-1).clamp(min=NO_TOKEN))
        need_after = self.tables.need(sent.repeat_interleave(w), after)[0].view(-1, w)
        rem = (self.max_len[rows] - step).unsqueeze(1)
        ok = cand.ge(0) & need_after.le(rem - 1)
        idx = cand.clamp(min=PAD)
        sub = probs[rows]
        keep = torch.where(ok, sub.gather(1, idx).clamp(min=FLOOR), 0.0)
        probs[rows] = sub.zero_().scatter_(1, idx, keep)

    def advance(self, rows: Tensor, tokens: Tensor) -> "LexicalState":
        sent = self.sent.index_select(0, rows)
        prog = self.tables.after(sent, self.prog.index_select(0, rows), tokens)
        return LexicalState(self.tables, sent, prog, self.max_len.index_select(0, rows))

    def next_tokens(self) -> Tensor:
        """[R, C] the token that advances each constraint of each row (-1 where met)."""
        toks = self.tables.tokens[self.sent]
        nxt = toks.gather(2, self.prog.clamp(max=toks.size(2) - 1).unsqueeze(2)).squeeze(2)
        return torch.where(self.prog < self.tables.lens[self.sent], nxt, -1)

    def select(self, probs: Tensor, scores: Tensor):
        """The generator's step with dynamic beam allocation (module doc): probs [N, K, V],
        scores [N, K]; returns what nmt.search.generator._candidates returns (candidates
        [N, M] in the order the beam takes them; finished [N, K]; pos, alive [N, K])."""
        n, k, v = probs.shape
        cands = self._candidates(probs, scores)
        c_scores, c_beams, c_tokens = cands[0], cands[1], cands[2]
        m = c_scores.size(1)
        rows = (torch.arange(n, device=probs.device) * k).unsqueeze(1) + c_beams     # [N, M]
        flat = rows.reshape(-1)
        after = self.tables.after(self.sent[flat], self.prog[flat], c_tokens.reshape(-1))
        need = self.tables.need(self.sent[flat], after)[0].view(n, m)
        total = self.tables.lens[self.sent[rows[:, 0]]].sum(1, keepdim=True)        # [N, 1]
        bank = torch.where(torch.isfinite(c_scores), total - need, -1)
        order = round_robin(c_scores, c_beams * v + c_tokens, bank)
        c_scores, c_beams, c_tokens, c_lprobs = (x.gather(1, order) for x in cands)
        return (c_scores, c_beams, c_tokens, c_lprobs,
                *split_candidates(c_scores, c_tokens, EOS, k))

    def _candidates(self, probs: Tensor, scores: Tensor) -> list[Tensor]:
        """(scores, beams, tokens, log-probs) [N, M] each: the best 2k extensions, each row's
        best token and the tokens advancing its constraints; a (row, token) seen twice has
        score -inf the second time, as has anything impossible (a met constraint's slot
        holds pad)."""
        n, k, v = probs.shape
        top = beam_candidates(probs, scores, 2 * k)
        flat = probs.reshape(n * k, v)
        # argmax: the first of equal maxima, the smaller id (as topk_stable breaks ties)
        toks = torch.cat([flat.argmax(1, keepdim=True), self.next_tokens()], 1)   # [R, W]
        w = toks.size(1)
        lp = flat.gather(1, toks.clamp(min=PAD)).masked_fill(toks < 0, 0.0).log()
        extra = [(scores.reshape(n * k, 1) + lp).view(n, k * w),
                 torch.arange(k, device=probs.device).repeat_interleave(w).expand(n, k * w),
                 toks.clamp(min=PAD).view(n, k * w), lp.view(n, k * w)]
        c = [torch.cat([a, b], 1) for a, b in zip(top, extra)]
        key = c[1] * v + c[2]
        srt, perm = key.sort(dim=1, stable=True)
        dup = torch.zeros_like(srt, dtype=torch.bool)
        dup[:, 1:] = srt[:, 1:] == srt[:, :-1]
        c[0] = c[0].masked_fill(torch.zeros_like(dup).scatter(1, perm, dup), float("-inf"))
        return c


def round_robin(scores: Tensor, key: Tensor, bank: Tensor) -> Tensor:
    """[N, M] candidate order of dynamic beam allocation: each bank's candidates ranked by
    (score desc, ``key`` asc), then taken rank by rank, from the highest bank down; those of
    bank -1 (impossible) last. ``key`` (row * V + token) is unique among possible ones."""
    n, m = scores.shape
    perm = key.argsort(dim=1, stable=True)
    for x in (scores, bank):                                 # stable: earlier keys break ties
        perm = perm.gather(1, x.gather(1, perm).sort(dim=1, descending=True, stable=True)[1])
    b = bank.gather(1, perm)                                 # banks, highest first
    pos = torch.arange(m, device=scores.device).expand(n, m)
    change = torch.ones_like(b, dtype=torch.bool)
    change[:, 1:] = b[:, 1:] != b[:, :-1]
    rank = pos - torch.where(change, pos, 0).cummax(1).values
    top = int(b.max()) + 2
    order_key = torch.where(b >= 0, rank * top + (top - 1 - b), m * top + pos)
    return perm.gather(1, order_key.argsort(dim=1))


__all__ = ["LexicalConstraints", "LexicalState", "encode_constraints", "check_room",
           "refuse_with", "automaton", "round_robin"]
