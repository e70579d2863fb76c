"""One or several models behind the interface beam search needs: encode, init_state, step.

An ensemble averages the models' next-token *probabilities* (mean_i p_i, the distribution
fairseq's ensembles use: it computes the same as logsumexp_i log p_i - log n), so the result is
again a normalised distribution and a single model is the special case n = 1. Beam search takes
the log of the few candidates it keeps, not of the whole vocabulary. All models must share
the target vocabulary (and, since they read the same source ids, the source one).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.errors import NmtError
from nmt.specials import BOS


@dataclass
class EnsembleState:
    """The decoder states of every model, reordered and shrunk together."""

    states: list[Any]

    def reorder(self, index: Tensor) -> "EnsembleState":
        return EnsembleState([s.reorder(index) for s in self.states])

    def select_sentences(self, keep: Tensor, rows: Tensor | None = None) -> "EnsembleState":
        return EnsembleState([select_and_reorder(s, keep, rows) for s in self.states])

    def expand(self, group: int) -> "EnsembleState":
        return EnsembleState([s.expand(group) for s in self.states])


def select_and_reorder(state: Any, keep: Tensor, rows: Tensor | None) -> Any:
    """``state.select_sentences(keep, rows)``: sentences ``keep`` [B'] and, when ``rows`` is
    given, the old rows [B'*group] that become the new ones. A state whose select_sentences
    takes no ``rows`` (a model's own state class) selects, then reorders."""
    if rows is None:
        return state.select_sentences(keep)
    if _takes_rows(type(state)):
        return state.select_sentences(keep, rows=rows)
    g = rows.numel() // max(keep.numel(), 1)
    first = (torch.arange(keep.numel(), device=rows.device) - keep) * g     # new - old start
    return state.select_sentences(keep).reorder(rows + first.repeat_interleave(g))


@functools.lru_cache(maxsize=None)
def _takes_rows(state_type: type) -> bool:
    return "rows" in inspect.signature(state_type.select_sentences).parameters


class EnsembleModel:
    """Wraps models exposing ``encode(src)``, ``init_state(enc, group)``, ``decode(prev, state)``
    (nmt.models.Transformer, or a scripted model in tests), whose states have ``reorder``,
    ``select_sentences`` and ``expand`` (nmt.models.state.DecoderState)."""

    def __init__(self, models: Sequence[Any]):
        if not models:
            raise ValueError("an ensemble needs at least one model")
        self.models = list(models)

    def __len__(self) -> int:
        return len(self.models)

    @property
    def max_positions(self) -> int | None:
        """Longest sequence every model accepts (None: unbounded, sinusoidal positions)."""
        limits = [getattr(m, "max_positions", None) for m in self.models]
        limits = [x for x in limits if x is not None]
        return min(limits) if limits else None

    @property
    def decoder_width(self) -> int | None:
        """Decoder layers x d_model summed over the models (what each row of a batch holds per
        position, and what a step computes, grow with it); None when a model has no ``cfg``."""
        cfgs = [getattr(m, "cfg", None) for m in self.models]
        if any(c is None for c in cfgs):
            return None
        return sum(c.decoder_width for c in cfgs)

    @property
    def start_token(self) -> int:
        """The id every model's decoder starts from (a model without ``start_token``, e.g. a
        scripted one in tests, starts from bos)."""
        starts = {getattr(m, "start_token", BOS) for m in self.models}
        if len(starts) > 1:
            raise NmtError(f"the models of an ensemble must start decoding from the same "
                           f"symbol, these start from ids {sorted(starts)}")
        return starts.pop()

    def encode(self, src_tokens: Tensor) -> list[Any]:
        return [m.encode(src_tokens) for m in self.models]

    def init_state(self, encs: list[Any], group: int) -> EnsembleState:
        return EnsembleState([m.init_state(e, group=group) for m, e in zip(self.models, encs)])

    @property
    def step_logits(self):
        """For one model, a function (prev_tokens [R, 1], state) -> (its next-token logits
        [R, V] in its own dtype, state): what a search that needs no probabilities (greedy
        without scores) decodes with. None for an ensemble, whose probabilities are a mean."""
        return self._step_logits if len(self.models) == 1 else None

    def _step_logits(self, prev_tokens: Tensor, state: EnsembleState
                     ) -> tuple[Tensor, EnsembleState]:
        logits, s = self.models[0].decode(prev_tokens, state.states[0])     # [R, 1, V]
        return logits[:, -1], EnsembleState([s])

    def step(self, prev_tokens: Tensor, state: EnsembleState) -> tuple[Tensor, EnsembleState]:
        """prev_tokens [R, 1] (the last token of each row) -> next-token probabilities [R, V]
        (float32, even when the models run in fp16/bf16), averaged over the models."""
        probs, states = None, []
        for m, s in zip(self.models, state.states):
            logits, s = m.decode(prev_tokens, s)                 # [R, 1, V]
            p = F.softmax(logits[:, -1], dim=-1, dtype=torch.float32)   # [R, V], no copy
            probs = p if probs is None else probs.add_(p)
            states.append(s)
        if len(self.models) > 1:
            probs.div_(len(self.models))
        return probs, EnsembleState(states)


__all__ = ["EnsembleModel", "EnsembleState", "select_and_reorder"]
