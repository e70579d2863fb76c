"""Analytic FLOP count of a Transformer training step (for MFU in benchmarks and logs).

Counts the matrix multiplications on the real (unpadded) lengths, 2 FLOPs per multiply-add:
what a perfect implementation must compute. A training step is 3x the forward pass (the
backward pass computes gradients for both inputs and weights of every matmul).
"""

from __future__ import annotations

import numpy as np

from nmt.config import ModelConfig


def forward_flops(cfg: ModelConfig, src_lens: np.ndarray, tgt_lens: np.ndarray,
                  tgt_vocab: int) -> float:
    """FLOPs of one forward pass over sentence pairs with these lengths (eos included)."""
    s = np.asarray(src_lens, dtype=np.float64)
    t = np.asarray(tgt_lens, dtype=np.float64)
    d, f, h = cfg.d_model, cfg.d_ff, cfg.heads
    dk, dv = cfg.head_dim_k * h, cfg.head_dim_v * h          # total q/k and v widths
    proj_self = 2 * d * (2 * dk + dv) + 2 * dv * d           # Q, K, V and output, per token
    ffn = 4 * d * f                                          # two linear layers, per token
    enc = cfg.encoder_layers * ((proj_self + ffn) * s + 2 * s * s * (dk + dv))
    dec_self = (proj_self + ffn) * t + 2 * t * t * (dk + dv)
    dec_cross = (2 * d * dk + 2 * dv * d) * t + 2 * d * (dk + dv) * s + 2 * t * s * (dk + dv)
    dec = cfg.decoder_layers * (dec_self + dec_cross)
    out = 2 * d * tgt_vocab * t
    return float((enc + dec + out).sum())


def train_flops(cfg: ModelConfig, src_lens, tgt_lens, tgt_vocab: int) -> float:
    return 3.0 * forward_flops(cfg, src_lens, tgt_lens, tgt_vocab)
