"""Validation during training: loss/perplexity on all ranks, greedy BLEU on rank 0."""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from nmt.data.batching import BOS, EOS, PAD, TokenBatchSampler, collate
from nmt.training.distributed import DistInfo, all_reduce_sum

log = logging.getLogger("nmt.train")


def validation_loss(trainer, dataset, sampler: TokenBatchSampler,
                    info: DistInfo) -> dict[str, float]:
    """Mean label-smoothed loss and NLL per target token (nats) and ppl = exp(nll)."""
    loss = torch.zeros((), dtype=torch.float64, device=trainer.device)
    nll = torch.zeros((), dtype=torch.float64, device=trainer.device)
    ntok = 0
    for idx in sampler.shard_batches(0):
        l, n, t = trainer.valid_step(None if idx is None else collate(dataset, idx))
        loss += l.double()
        nll += n.double()
        ntok += t
    stats = torch.stack([loss, nll, torch.tensor(float(ntok), dtype=torch.float64,
                                                 device=trainer.device)])
    all_reduce_sum(stats, info)
    loss_v, nll_v, ntok_v = stats.tolist()
    if ntok_v == 0:
        return {"loss": float("nan"), "nll_loss": float("nan"), "ppl": float("nan"), "ntokens": 0}
    mean_nll = nll_v / ntok_v
    return {"loss": loss_v / ntok_v, "nll_loss": mean_nll,
            "ppl": math.exp(min(mean_nll, 700.0)), "ntokens": int(ntok_v)}


@torch.no_grad()
def greedy_decode(model, src_tokens: torch.Tensor, max_len_a: float = 1.0,
                  max_len_b: int = 50) -> list[list[int]]:
    """Greedy search with the model's incremental decoder; ids without eos, one list per row.

    src_tokens [B, S] right-padded with eos at the end of each row.
    """
    model.eval()
    b = src_tokens.size(0)
    src_len = src_tokens.ne(PAD).sum(1)                                  # [B]
    max_len = int(max_len_a * int(src_len.max()) + max_len_b)
    enc = model.encode(src_tokens)
    state = model.init_state(enc, group=1)
    prev = torch.full((b, 1), BOS, dtype=torch.long, device=src_tokens.device)
    out = torch.full((b, max_len), PAD, dtype=torch.long, device=src_tokens.device)
    done = torch.zeros(b, dtype=torch.bool, device=src_tokens.device)
    limit = (max_len_a * src_len.double() + max_len_b).long()           # [B] per-row limit
    for t in range(max_len):
        logits, state = model.decode(prev, state)                        # [B, 1, V]
        lp = logits[:, -1].float()
        lp[:, PAD] = -math.inf
        lp[:, BOS] = -math.inf
        nxt = lp.argmax(-1)                                              # [B]
        nxt = torch.where(done | (t >= limit), torch.full_like(nxt, EOS), nxt)
        out[:, t] = torch.where(done, torch.full_like(nxt, PAD), nxt)
        done |= nxt.eq(EOS)
        if bool(done.all()):
            break
        prev = nxt.unsqueeze(1)
    hyps = []
    for row in out.tolist():
        ids = []
        for tok in row:
            if tok in (EOS, PAD):
                break
            ids.append(tok)
        hyps.append(ids)
    return hyps


def validation_bleu(model, dataset, tgt_codec, device: torch.device, max_tokens: int,
                    max_len_a: float, max_len_b: int) -> dict[str, Any]:
    """Corpus BLEU of greedy translations against the decoded (detokenized) references."""
    import sacrebleu

    sampler = TokenBatchSampler(dataset.src_sizes, dataset.tgt_sizes, max_tokens, shuffle=False)
    hyps: dict[int, str] = {}
    refs: dict[int, str] = {}
    for idx in sampler.global_batches(0):
        batch = collate(dataset, idx)
        out = greedy_decode(model, batch.src_tokens.to(device), max_len_a, max_len_b)
        for i, ids in zip(idx.tolist(), out):
            hyps[i] = tgt_codec.decode(ids)
            refs[i] = tgt_codec.decode(dataset.tgt(i).tolist())
    order = sorted(hyps)
    bleu = sacrebleu.corpus_bleu([hyps[i] for i in order], [[refs[i] for i in order]])
    return {"bleu": round(bleu.score, 2), "bleu_sentences": len(order)}
