"""Dropout, with a choice of how its masks are drawn on a CPU.

On a CPU, ``F.dropout`` draws its keep-mask with ``bernoulli_``: per element one 64-bit number
from the default generator (two mt19937 outputs, drawn one after the other on one core), turned
into a double and compared with 1 - p. The generator is most of dropout's cost, which was about
9% of a transformer_small update (BENCHMARKS.md, "Training: where the time goes").

``masks="torch"`` (the default) is ``F.dropout`` itself, so every published run is reproduced
bit for bit. ``masks="fast"`` (``nmt-train --dropout-masks fast``) draws a quarter of the random
bits: 15 per element, four elements from one 64-bit draw, with the keep probability rounded to a
multiple of 2^-15 and the scale its exact inverse, so the output is unbiased. Its masks are not
torch's: a run with them differs from a run with torch's as a run with another seed would. On a
GPU, or for an unusual dtype, ``F.dropout`` (fused there) runs either way.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

MASKS = ("torch", "fast")
_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_LEVELS = 1 << 15        # fast masks: keep iff 15 random bits < round(keep * 2^15)


def fast_keep_mask(shape: torch.Size, keep: float) -> tuple[Tensor, float]:
    """(bool keep-mask, scale): 15 random bits per element from the four 16-bit lanes of each
    int64 draw (``random_()`` leaves only the top bit of the top lane fixed; it is masked off)."""
    n = math.prod(shape)
    words = torch.empty((n + 3) // 4, dtype=torch.int64).random_()
    lanes = words.view(torch.int16)[:n].view(shape)
    level = min(_LEVELS, max(1, round(keep * _LEVELS)))
    return torch.lt(lanes.bitwise_and_(_LEVELS - 1), level), _LEVELS / level


def dropout(x: Tensor, p: float, training: bool = True, masks: str = "torch") -> Tensor:
    """``F.dropout(x, p, training)``; with ``masks="fast"`` on a CPU, the cheaper masks of
    :func:`fast_keep_mask`."""
    if (masks == "fast" and training and 0.0 < p < 1.0 and x.device.type == "cpu"
            and x.dtype in _DTYPES and x.numel() > 0):
        mask, scale = fast_keep_mask(x.shape, 1.0 - p)
        return x.mul(mask).mul_(scale)
    return F.dropout(x, p, training)


class Dropout(nn.Module):
    """``nn.Dropout`` whose masks are drawn as ``masks`` says ("torch" or "fast"); a whole
    model is switched by :func:`set_dropout_masks`."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p
        self.masks = "torch"

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training, self.masks)

    def extra_repr(self) -> str:
        return f"p={self.p}" + (", masks=fast" if self.masks == "fast" else "")


def set_dropout_masks(model: nn.Module, masks: str) -> None:
    """Draw every :class:`Dropout` of ``model`` with ``masks`` ("torch" or "fast")."""
    if masks not in MASKS:
        raise ValueError(f"dropout masks must be one of {', '.join(MASKS)}, got {masks!r}")
    for m in model.modules():
        if isinstance(m, Dropout):
            m.masks = masks
