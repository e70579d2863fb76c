"""The GNMT length penalty (Wu et al. 2016), used by the paper with alpha = 0.6 (section 6.1).

    lp(Y) = ((5 + |Y|) / 6) ** alpha,      final score = log P(Y | X) / lp(Y)

|Y| counts every generated token *including* the final eos (the eos is predicted and scored like
any other token, so it counts in the length too). With alpha = 0 the score is the plain
log-probability.
"""

from __future__ import annotations

import torch
from torch import Tensor


def length_penalty(length: int | float | Tensor, alpha: float) -> float | Tensor:
    """lp(|Y|) for a length (int) or lengths (tensor, any shape); 1 when alpha is 0."""
    if isinstance(length, Tensor):
        if alpha == 0:
            return torch.ones_like(length, dtype=torch.float32)
        return ((5.0 + length.float()) / 6.0) ** alpha
    return 1.0 if alpha == 0 else ((5.0 + float(length)) / 6.0) ** alpha


def best_possible_score(log_prob: Tensor, max_length: Tensor, alpha: float) -> Tensor:
    """Upper bound on the final normalized score of an unfinished hypothesis.

    ``log_prob`` [N] is its current log-probability (<= 0), ``max_length`` [N] the largest |Y| it
    may still reach. Every further token multiplies P(Y) by a probability <= 1, so the final
    log-probability is <= ``log_prob``; dividing a non-positive number by a larger lp makes it
    larger, and lp grows with |Y|, so the best it could ever score is
    ``log_prob / lp(max_length)``. With alpha = 0 this is simply ``log_prob``.
    """
    if alpha == 0:
        return log_prob
    return log_prob / length_penalty(max_length, alpha)


__all__ = ["length_penalty", "best_possible_score"]
