"""Length penalties: how a finished hypothesis's log-probability is normalized by its length.

    final score = log P(Y | X) / lp(|Y|)

|Y| counts every generated token *including* the final eos (the eos is predicted and scored like
any other token, so it counts in the length too). Three formulas (``--lenpen-formula``), each
with its alpha (``--lenpen``):

- ``gnmt`` (nmt's default, the paper's with alpha = 0.6, section 6.1; Wu et al. 2016):
  lp(Y) = ((5 + |Y|) / 6) ** alpha;
- ``fairseq`` (fairseq-generate's ``--lenpen``, default 1.0): lp(Y) = |Y| ** alpha;
- ``hf`` (transformers' beam search ``length_penalty``, default 1.0): the same lp as fairseq's
  (``sum_logprobs / generated_len ** length_penalty``, the length counting the eos and not the
  decoder start), but its own rule for when a sentence is done; see nmt.search.generator.

With alpha = 0 every formula gives lp = 1: the plain log-probability.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING

if TYPE_CHECKING:            # imported where a tensor is given: the float form needs no torch
    from torch import Tensor

FORMULAS = ("gnmt", "fairseq", "hf")


def length_penalty(length: "int | float | Tensor", alpha: float,
                   formula: str = "gnmt") -> "float | Tensor":
    """lp(|Y|) for a length (int) or lengths (tensor, any shape); 1 when alpha is 0."""
    if formula not in FORMULAS:
        raise ValueError(f"unknown length penalty formula {formula!r}; expected one of "
                         f"{', '.join(FORMULAS)}")
    if not isinstance(length, numbers.Real):          # a tensor
        import torch

        if alpha == 0:
            return torch.ones_like(length, dtype=torch.float32)
        base = (5.0 + length.float()) / 6.0 if formula == "gnmt" else length.float()
        return base ** alpha
    if alpha == 0:
        return 1.0
    base = (5.0 + float(length)) / 6.0 if formula == "gnmt" else float(length)
    return base ** alpha


def best_possible_score(log_prob: "Tensor", max_length: "Tensor", alpha: float,
                        formula: str = "gnmt") -> "Tensor":
    """Upper bound on the final normalized score of an unfinished hypothesis.

    ``log_prob`` [N] is its current log-probability (<= 0), ``max_length`` [N] the largest |Y| it
    may still reach. Every further token multiplies P(Y) by a probability <= 1, so the final
    log-probability is <= ``log_prob``; dividing a non-positive number by a larger lp makes it
    larger, and lp grows with |Y| in every formula, so the best it could ever score is
    ``log_prob / lp(max_length)``. With alpha = 0 this is simply ``log_prob``.
    """
    if alpha == 0:
        return log_prob
    return log_prob / length_penalty(max_length, alpha, formula)


__all__ = ["FORMULAS", "length_penalty", "best_possible_score"]
