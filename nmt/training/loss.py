"""Label-smoothed cross entropy (section 5.4), summed over target tokens.

Normalisation is the trainer's job, fairseq style: each micro-batch returns *sums*, and the
summed gradient of an update (across ``--update-freq`` micro-batches and all ranks) is divided
once by the update's total number of target tokens. That makes gradient accumulation exactly
equal to one step on the concatenated batch.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def label_smoothed_nll_loss(lprobs: Tensor, target: Tensor,
                            epsilon: float) -> tuple[Tensor, Tensor]:
    """lprobs [N, V] log-probabilities, target [N] (no padding) -> (loss sum, nll sum).

    The smoothing mass epsilon is spread uniformly over the V - 1 wrong classes, so the target
    gets 1 - epsilon, as in fairseq's label_smoothed_cross_entropy.
    """
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)     # [N]
    nll_sum = nll.sum()
    if epsilon == 0.0:
        return nll_sum, nll_sum
    smooth_sum = -lprobs.sum()                                       # sum over N and V
    eps_i = epsilon / (lprobs.size(-1) - 1)
    loss = (1.0 - epsilon - eps_i) * nll_sum + eps_i * smooth_sum
    return loss, nll_sum


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Fused label-smoothed cross entropy from logits, for speed and memory.

    With q the smoothed target distribution (1 - epsilon on the target, epsilon / (V - 1)
    elsewhere), loss = sum_n H(q_n, softmax(z_n)) and its gradient is simply
    softmax(z) - q. Autograd through log_softmax + gather + sum materialises a zero-filled
    gather gradient, a broadcast sum gradient and their sum, each an [N, V] pass; here the
    forward is one log_softmax kernel plus two reads and the backward one exp plus an in-place
    subtraction. The logits are not kept alive for backward, only the log-probabilities.
    """

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float):
        # logits [N, V] (float32/64), target [N]
        lprobs = torch.log_softmax(logits, dim=-1)                        # [N, V]
        nll = -lprobs.gather(-1, target.unsqueeze(-1)).sum()
        v = logits.size(-1)
        eps_i = epsilon / (v - 1) if v > 1 else 0.0
        if epsilon:
            loss = (1.0 - epsilon - eps_i) * nll - eps_i * lprobs.sum()
        else:
            loss = nll.clone()
        ctx.save_for_backward(lprobs, target)
        ctx.eps = (epsilon, eps_i)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor | None):
        lprobs, target = ctx.saved_tensors
        epsilon, eps_i = ctx.eps
        # softmax(z) - q; the second output (nll) is a statistic, not differentiated.
        grad = torch.exp(lprobs)                                          # [N, V]
        if eps_i:
            grad.sub_(eps_i)
        grad.scatter_add_(-1, target.unsqueeze(-1),
                          lprobs.new_full((lprobs.size(0), 1), -(1.0 - epsilon - eps_i)))
        grad.mul_(grad_loss)
        return grad, None, None


def smoothed_cross_entropy(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """(loss sum, nll sum) from logits [N, V] and targets [N]; equals
    ``label_smoothed_nll_loss(log_softmax(logits), target, epsilon)``."""
    return _SmoothedCrossEntropy.apply(logits, target, epsilon)


class ModelWithLoss(torch.nn.Module):
    """The model and its loss in one forward, so that DistributedDataParallel sees every use of
    the (tied) output projection inside ``forward``."""

    def __init__(self, model: torch.nn.Module, epsilon: float, pad_idx: int = 0):
        super().__init__()
        self.model = model
        self.epsilon = epsilon
        self.pad_idx = pad_idx

    def forward(self, src_tokens: Tensor, prev_output_tokens: Tensor, target: Tensor,
                target_positions: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Returns (loss sum, nll sum) over the non-padding target tokens.

        Only those positions are projected onto the vocabulary: the [*, V] projection and
        softmax dominate the decoder at small d_model, and a bucketed batch still has padding.
        ``target_positions`` [N]: flat indices of the non-padding targets (from collate);
        derived from ``target`` when absent.
        """
        hidden = self.model(src_tokens, prev_output_tokens, return_hidden=True)   # [B, T, D]
        if target_positions is None:
            target_positions = target.ne(self.pad_idx).flatten().nonzero().squeeze(1)
        h = hidden.flatten(0, 1).index_select(0, target_positions)                # [N, D]
        tgt = target.flatten().index_select(0, target_positions)                  # [N]
        logits = self.model.output_projection(h)                                  # [N, V]
        # the loss in fp32 even under autocast: it sums thousands of tokens.
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        return smoothed_cross_entropy(logits, tgt, self.epsilon)


def perplexity(nll_per_token_nats: float) -> float:
    """exp of the mean per-token NLL in nats (the base of every loss reported by nmt)."""
    try:
        return math.exp(nll_per_token_nats)
    except OverflowError:
        return float("inf")
