"""Explicit, typed state of incremental decoding (the KV cache).

Nothing is hidden on the modules: ``model.decode`` takes a state and returns a new one.
Rows are sentence-major: with ``group`` = beam size, decoder row ``b * group + k`` is beam ``k``
of sentence ``b``. Encoder-decoder keys/values are stored once per sentence and shared by its
``group`` rows; self-attention keys/values are stored per row and grow by one step per call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class EncoderOut:
    out: Tensor        # [B, S, D] encoder output
    pad_mask: Tensor   # [B, S] bool, True at padding

    def attn_mask(self) -> Tensor | None:
        """[B, 1, 1, S] bool mask for SDPA (True = attend), or None when nothing is padded."""
        if not bool(self.pad_mask.any()):
            return None
        return ~self.pad_mask[:, None, None, :]

    def select(self, index: Tensor) -> "EncoderOut":
        return EncoderOut(self.out.index_select(0, index), self.pad_mask.index_select(0, index))


@dataclass
class DecoderState:
    self_k: list[Tensor]       # per layer [B*group, H, t, dk]: keys of the t steps decoded so far
    self_v: list[Tensor]       # per layer [B*group, H, t, dv]
    cross_k: list[Tensor]      # per layer [B, H, S, dk]: computed once from the encoder output
    cross_v: list[Tensor]      # per layer [B, H, S, dv]
    memory_mask: Tensor | None  # [B, 1, 1, S] bool, True = attend; None when nothing is padded
    group: int                 # decoder rows per sentence (beam size)
    step: int                  # number of target positions already in the cache

    @property
    def num_rows(self) -> int:
        return self.self_k[0].size(0) if self.self_k else 0

    def reorder(self, index: Tensor) -> "DecoderState":
        """Select decoder rows (beam reordering). ``index`` [B*group] must map each sentence's
        rows to rows of the same sentence, since encoder keys/values are shared per sentence."""
        return DecoderState(
            self_k=[k.index_select(0, index) for k in self.self_k],
            self_v=[v.index_select(0, index) for v in self.self_v],
            cross_k=self.cross_k, cross_v=self.cross_v, memory_mask=self.memory_mask,
            group=self.group, step=self.step)

    def select_sentences(self, keep: Tensor) -> "DecoderState":
        """Keep only sentences ``keep`` [B'] (e.g. drop finished ones), with all their rows."""
        g = self.group
        rows = (keep.unsqueeze(1) * g + torch.arange(g, device=keep.device)).reshape(-1)
        mask = None if self.memory_mask is None else self.memory_mask.index_select(0, keep)
        return DecoderState(
            self_k=[k.index_select(0, rows) for k in self.self_k],
            self_v=[v.index_select(0, rows) for v in self.self_v],
            cross_k=[k.index_select(0, keep) for k in self.cross_k],
            cross_v=[v.index_select(0, keep) for v in self.cross_v],
            memory_mask=mask, group=g, step=self.step)
