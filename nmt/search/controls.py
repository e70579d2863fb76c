"""Decoding controls that forbid or penalize tokens step by step, as fairseq-generate's options
of the same names: ``min_len`` (no eos before that many tokens), ``no_repeat_ngram_size`` (no
n-gram twice in an output) and ``unkpen`` (``<unk>``'s log-probability lowered by that much).

They are a constraints object of nmt.search.generator (``start`` / ``restrict`` / ``advance``),
so beam search, diverse beam search and sampling apply them alike, and :func:`combine` puts them
in front of the task's constraints (tree constraints, forced prefixes) or lexical ones. Every
decision looks at one row's own tokens only: a sentence translates the same whatever its batch.

Counting follows fairseq: steps and lengths count the generated tokens (not the start symbol,
not the eos); a forced prefix's tokens count as generated. ``min_len`` yields to the length
limit: at ``max_len`` the eos is forced all the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.specials import EOS, UNK


@dataclass(frozen=True)
class DecodingControls:
    min_len: int = 0
    no_repeat_ngram_size: int = 0
    unkpen: float = 0.0

    @classmethod
    def from_search(cls, cfg) -> "DecodingControls | None":
        """The controls a SearchConfig asks for; None when it asks for none."""
        c = cls(cfg.minimum, cfg.no_repeat_ngram_size, cfg.unkpen)
        return c if c.active else None

    @property
    def active(self) -> bool:
        return bool(self.min_len or self.no_repeat_ngram_size or self.unkpen)

    def start(self, src_tokens: Tensor, beam: int, max_len: Tensor) -> "ControlsState":
        rows = src_tokens.size(0) * beam
        history = torch.empty(rows, 0, dtype=torch.long, device=src_tokens.device)
        return ControlsState(self, history)


@dataclass
class ControlsState:
    controls: DecodingControls
    history: Tensor             # [R, step]: the tokens each row generated so far

    def restrict(self, probs: Tensor, step: int) -> None:
        c = self.controls
        if step < c.min_len:
            probs[:, EOS] = 0.0
        if c.unkpen:
            probs[:, UNK] *= math.exp(-c.unkpen)
        if c.no_repeat_ngram_size:
            ban_repeats(probs, self.history, c.no_repeat_ngram_size)

    def advance(self, rows: Tensor, tokens: Tensor) -> "ControlsState":
        hist = self.history.index_select(0, rows)
        return ControlsState(self.controls, torch.cat([hist, tokens.unsqueeze(1)], dim=1))


def ban_repeats(probs: Tensor, history: Tensor, n: int) -> None:
    """Zero, in ``probs`` [R, V], each token that would complete an n-gram already in its row's
    ``history`` [R, T]: the tokens that followed an earlier occurrence of the last n - 1."""
    t = history.size(1)
    if t < n:                   # no complete n-gram yet
        return
    if n == 1:
        probs.scatter_(1, history, 0.0)
        return
    windows = history.unfold(1, n, 1)                       # [R, T - n + 1, n]
    last = history[:, t - n + 1:]                           # [R, n - 1]
    match = windows[:, :, :n - 1].eq(last.unsqueeze(1)).all(dim=2)     # [R, W]
    r, w = match.nonzero(as_tuple=True)
    if r.numel():
        probs[r, windows[r, w, n - 1]] = 0.0


def combine(*constraints):
    """One constraints object applying each given one (None ones left out; combined ones
    flattened) in order: its ``restrict`` runs theirs one after the other, its ``advance``
    advances them all, its ``select`` is the first one's that has one."""
    parts = [p for c in constraints if c is not None
             for p in (c.parts if isinstance(c, Combined) else (c,))]
    if len(parts) <= 1:
        return parts[0] if parts else None
    return Combined(tuple(parts))


@dataclass(frozen=True)
class Combined:
    parts: tuple

    def start(self, src_tokens: Tensor, beam: int, max_len: Tensor) -> "CombinedState":
        return CombinedState([p.start(src_tokens, beam, max_len) for p in self.parts])


@dataclass
class CombinedState:
    states: list

    def restrict(self, probs: Tensor, step: int) -> None:
        # A forced prefix token is forced whatever the others forbid, with the model's own
        # probability (read before them: a control may have zeroed it, e.g. a repeated n-gram).
        forcing = [s for s in self.states if getattr(s, "forces_tokens", False)
                   and step < s.width]
        model = probs.clone() if forcing else None
        for s in self.states:
            if not any(s is f for f in forcing):
                s.restrict(probs, step)
        for s in forcing:
            s.restrict(probs, step, model)

    def advance(self, rows: Tensor, tokens: Tensor) -> "CombinedState":
        return CombinedState([s.advance(rows, tokens) for s in self.states])

    @property
    def select(self):
        """The candidate selection of the first state with one (nmt.search.generator's hook:
        lexical constraints' dynamic beam allocation); None when none has one."""
        return next((f for s in self.states if (f := getattr(s, "select", None)) is not None),
                    None)


__all__ = ["DecodingControls", "ControlsState", "ban_repeats", "combine"]
