"""Forced target prefixes: each sentence's translation starts with given target ids, and beam
search continues from there (a constraints object for nmt.search.generator.beam_search).

While a row has prefix tokens left, its only allowed token is the next one; the model's own
probability of it stays in the score (floored, so that a prefix the model finds impossible is
still forced), so the hypotheses' scores remain the model's log-probabilities of their whole
output. A prefix the target vocabulary cannot spell, or longer than its sentence's length
limit, is refused before anything is decoded (nmt.search.lexical.check_room), as lexical
constraints are; the search still cuts a prefix at the limit, so that its table stays small.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from nmt.errors import NmtError
from nmt.search.constraints import FLOOR
from nmt.specials import UNK



def encode_prefixes(codec, prefixes: Sequence[str | None], first_line: int = 1
                    ) -> list[list[int]]:
    """Target ids of each raw prefix (None or "" for none). A prefix the target vocabulary
    cannot spell whole is refused (NmtError naming its line), as a lexical constraint is:
    forced as <unk>, the translation would start with it."""
    out = []
    for i, text in enumerate(prefixes):
        ids = list(codec.encode(text)) if text else []
        check_spelled(codec, ids, text, f"line {first_line + i}")
        out.append(ids)
    return out


def check_spelled(codec, ids: Sequence[int], text: str | None, where: str) -> None:
    """NmtError when the prefix ``text``, encoded as ``ids``, holds <unk>."""
    if UNK in ids:
        raise NmtError(f"{where}: prefix {text!r} cannot be spelled with the target vocabulary "
                       f"(encoded: {' '.join(codec.dictionary[int(t)] for t in ids)})")


class PrefixConstraints:
    """``prefixes[b]``: target ids (without eos; empty for none) of the batch's sentence b."""

    def __init__(self, prefixes: Sequence[Sequence[int] | np.ndarray]):
        self.prefixes = [np.asarray(p, dtype=np.int64).reshape(-1) for p in prefixes]

    def start(self, src_tokens: Tensor, beam: int, max_len: Tensor) -> "PrefixState":
        if len(self.prefixes) != src_tokens.size(0):
            raise ValueError(f"{len(self.prefixes)} prefixes for a batch of "
                             f"{src_tokens.size(0)} sentences")
        # A prefix token past a sentence's length limit is never emitted (the limit forces
        # eos there): cut each prefix at its limit, so that the table, repeated for every beam
        # row, is no larger than the search (a prefix of 300,000 tokens sent to nmt-serve).
        limits = max_len.tolist()
        cut = [p[:int(n)] for p, n in zip(self.prefixes, limits)]
        width = max((p.size for p in cut), default=0)
        table = np.full((len(cut), max(width, 1)), -1, dtype=np.int64)
        for b, p in enumerate(cut):
            table[b, :p.size] = p
        forced = torch.from_numpy(table).to(src_tokens.device).repeat_interleave(beam, 0)
        return PrefixState(forced, width)


@dataclass
class PrefixState:
    forced: Tensor          # [R, W]: the token each row must emit at step t, -1 when free
    width: int              # longest prefix of the batch

    forces_tokens = True    # (nmt.search.controls.Combined applies it last)

    def restrict(self, probs: Tensor, step: int, model_probs: Tensor | None = None) -> None:
        """Rows with a prefix token at ``step`` may emit that token only, with its probability
        in ``model_probs`` (the model's, before other constraints) or else in ``probs``."""
        if step >= self.width:
            return
        want = self.forced[:, step]                                   # [R]
        rows = want.ge(0).unsqueeze(1)                                # [R, 1]
        idx = want.clamp(min=0).unsqueeze(1)
        keep = (probs if model_probs is None else model_probs).gather(1, idx).clamp(min=FLOOR)
        probs.masked_fill_(rows, 0.0)
        probs.scatter_(1, idx, torch.where(rows, keep, probs.gather(1, idx)))

    def advance(self, rows: Tensor, tokens: Tensor) -> "PrefixState":
        return PrefixState(self.forced.index_select(0, rows), self.width)


__all__ = ["PrefixConstraints", "PrefixState", "encode_prefixes", "check_spelled"]
