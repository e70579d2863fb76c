"""Building blocks of the Transformer (paper, section 3): attention, feed-forward, positions.

Shapes: B batch rows, S source length, T target length, D d_model, H heads, dk/dv head sizes.
"""

from __future__ import annotations

import logging
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.models.dropout import Dropout

log = logging.getLogger("nmt")


def avoid_cudnn_attention() -> None:
    """Switch off cuDNN's fused attention for ``F.scaled_dot_product_attention`` in this
    process (once; flash, memory-efficient and math attention stay as they are).

    torch 2.11 prefers cuDNN's attention on Hopper, and cuDNN builds an execution plan for
    every new shape: ~4 ms of CPU per call, 80% of the CPU time of an update with NMT's batches
    of ever-changing lengths (transformer_base, bf16, on an H200: 34k target tokens/s with it,
    202k without). nmt's attention calls this before its first CUDA attention; the switch is
    global because torch's flag is, and setting it once keeps concurrent decoding threads
    (nmt-serve) from racing on it."""
    backends = torch.backends.cuda
    if getattr(backends, "cudnn_sdp_enabled", lambda: False)():
        backends.enable_cudnn_sdp(False)
        log.info("cuDNN attention switched off: it plans every new shape (about 4 ms of CPU "
                 "per call); flash or memory-efficient attention runs instead")


SINUSOID_LAYOUTS = ("interleaved", "fairseq", "marian")


def sinusoid_table(length: int, dim: int, offset: int = 0, layout: str = "interleaved") -> Tensor:
    """Sinusoidal encodings of positions offset .. offset+length-1, [length, dim] float32.

    ``layout`` (ModelConfig.sinusoid_layout) says how the sines and cosines are laid out, each
    computed as its toolkit computes it, so that imported models see the very same table:

    - "interleaved": eq. 4 as written, PE(pos, 2i) = sin(pos / 10000^(2i/d)),
      PE(pos, 2i+1) = cos(pos / 10000^(2i/d)) (nmt's own; float64, rounded to float32);
    - "fairseq": [sin | cos] halves with frequencies exp(-i ln(10000) / (d/2 - 1)), in float32
      as fairseq's SinusoidalPositionalEmbedding (an odd dim gets a zero last column);
    - "marian": [sin | cos] halves with eq. 4's frequencies 10000^(-2i/d), in float64 then
      rounded, as transformers' MarianSinusoidalPositionalEmbedding.
    """
    if layout == "interleaved":
        pos = torch.arange(offset, offset + length, dtype=torch.float64).unsqueeze(1)  # [L, 1]
        two_i = torch.arange(0, dim, 2, dtype=torch.float64)                      # [ceil(d/2)]
        angle = pos / torch.pow(10000.0, two_i / dim)                          # [L, ceil(d/2)]
        table = torch.zeros(length, dim, dtype=torch.float64)
        table[:, 0::2] = torch.sin(angle)
        table[:, 1::2] = torch.cos(angle[:, : dim // 2])
        return table.float()
    if layout == "fairseq":
        half = dim // 2
        freq = torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000) / (half - 1)))
        angle = torch.arange(offset, offset + length, dtype=torch.float).unsqueeze(1) * freq
        table = torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)              # [L, 2*half]
        if dim % 2:
            table = torch.cat([table, torch.zeros(length, 1)], dim=1)
        return table
    if layout == "marian":
        # The same float64 operations as transformers (Python's pow per column, numpy's
        # elementwise division, sin and cos on the same strided slices), for the same bits.
        denom = np.array([math.pow(10000, 2 * (j // 2) / dim) for j in range(dim)])
        angle = np.arange(offset, offset + length, dtype=np.float64)[:, None] / denom[None, :]
        cut = (dim + 1) // 2
        table = np.empty((length, dim), dtype=np.float64)
        table[:, :cut] = np.sin(angle[:, 0::2])
        table[:, cut:] = np.cos(angle[:, 1::2])
        return torch.from_numpy(table).float()
    raise ValueError(f"unknown sinusoid layout {layout!r}; expected one of "
                     f"{', '.join(SINUSOID_LAYOUTS)}")


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal encodings; the table grows on demand, so any length works.

    Position p of a sequence reads the encoding of p + ``offset`` (ModelConfig.position_offset).
    """

    def __init__(self, dim: int, initial_length: int = 1024, layout: str = "interleaved",
                 offset: int = 0):
        super().__init__()
        self.dim, self.layout, self.offset = dim, layout, offset
        # On the meta device (shapes only: nmt.models.transformer.meta_model) the values are
        # never read, and computing them there would load torch's python decompositions.
        table = (torch.empty(initial_length, dim) if torch.empty(0).is_meta
                 else sinusoid_table(initial_length, dim, offset, layout))
        self.register_buffer("table", table, persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """[length, D] encodings of positions offset .. offset+length-1."""
        end = offset + length
        if end > self.table.size(0):
            self.table = sinusoid_table(max(end, 2 * self.table.size(0)), self.dim, self.offset,
                                        self.layout).to(self.table.device)
        return self.table[offset:end]


class LearnedPositions(nn.Module):
    """Learned positional embeddings (Table 3, row E); at most ``max_positions`` positions.

    Position p reads row p + ``offset``: fairseq's tables keep ``offset`` unused rows first
    (padding_idx + 1), so that their weights load as they are.
    """

    def __init__(self, dim: int, max_positions: int, offset: int = 0):
        super().__init__()
        self.max_positions, self.offset = max_positions, offset
        self.weight = nn.Parameter(torch.empty(max_positions + offset, dim))
        nn.init.normal_(self.weight, mean=0.0, std=dim ** -0.5)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        end = offset + length
        if end > self.max_positions:
            raise ValueError(f"sequence of {end} positions exceeds max_positions="
                             f"{self.max_positions} of the learned positional embeddings")
        return self.weight[self.offset + offset:self.offset + end]


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention (section 3.2) on top of F.scaled_dot_product_attention.

    Self-attention projects queries, keys and values with one fused matrix (one GEMM instead of
    three); encoder-decoder attention projects the query separately and keys+values fused, so
    that keys and values of the encoder output can be computed once per sentence.
    """

    def __init__(self, d_model: int, heads: int, d_k: int, d_v: int, dropout: float,
                 self_attention: bool):
        super().__init__()
        self.heads, self.d_k, self.d_v = heads, d_k, d_v
        self.dropout = dropout
        self.self_attention = self_attention
        qk, v = heads * d_k, heads * d_v
        if self_attention:
            self.in_proj = nn.Linear(d_model, 2 * qk + v)
        else:
            self.q_proj = nn.Linear(d_model, qk)
            self.kv_proj = nn.Linear(d_model, qk + v)
        self.out_proj = nn.Linear(v, d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)

    # --- projections ----------------------------------------------------------------------------
    def _split(self, x: Tensor, dim: int) -> Tensor:
        """[N, L, H*dim] -> [N, H, L, dim]"""
        n, length, _ = x.shape
        return x.view(n, length, self.heads, dim).transpose(1, 2)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention projections of x [N, L, D] -> q, k [N, H, L, dk], v [N, H, L, dv]."""
        qk = self.heads * self.d_k
        q, k, v = self.in_proj(x).split([qk, qk, self.heads * self.d_v], dim=-1)
        return self._split(q, self.d_k), self._split(k, self.d_k), self._split(v, self.d_v)

    def project_q_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Self-attention projections of x [N, L, D] for a cache: q [N, H, L, dk] and the keys
        and values side by side, unsplit, [N, L, H*dk + H*dv] (nmt.models.state)."""
        qk = self.heads * self.d_k
        proj = self.in_proj(x)
        return self._split(proj[..., :qk], self.d_k), proj[..., qk:]

    def heads_of(self, x: Tensor, dim: int) -> Tensor:
        """Time-major [L, N, H*dim] (a cache view) -> [N, H, L, dim], a view."""
        length, n, _ = x.shape
        return x.view(length, n, self.heads, dim).permute(1, 2, 0, 3)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder-decoder keys and values of memory [B, S, D] -> [B, H, S, dk], [B, H, S, dv]."""
        k, v = self.kv_proj(memory).split([self.heads * self.d_k, self.heads * self.d_v], dim=-1)
        return self._split(k, self.d_k), self._split(v, self.d_v)

    def project_q(self, x: Tensor) -> Tensor:
        return self._split(self.q_proj(x), self.d_k)

    # --- attention ------------------------------------------------------------------------------
    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
               causal: bool = False, group: int = 1) -> Tensor:
        """softmax(q k^T / sqrt(dk)) v, merged back to [N, L, D].

        q: [N, H, Lq, dk]; k: [N/group, H, Lk, dk]; v: [N/group, H, Lk, dv]; mask: bool,
        broadcastable to [N/group, H, Lq*group, Lk], True where attention is allowed.
        ``group`` > 1 lets ``group`` consecutive query rows share one key/value row (the beams of
        one sentence sharing its encoder output): their queries are stacked along the length axis.
        """
        n, h, lq, _ = q.shape
        if group > 1:
            # [B*g, H, Lq, dk] -> [B, H, g*Lq, dk]
            q = q.view(n // group, group, h, lq, self.d_k).transpose(1, 2).reshape(
                n // group, h, group * lq, self.d_k)
        if lq == 1 and not self.training and not q.is_cuda:
            out = single_query_attention(q, k, v, mask)
        else:
            p = self.dropout if self.training else 0.0
            if q.is_cuda:
                avoid_cudnn_attention()
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                                 is_causal=causal)
        if group > 1:
            # [B, H, g*Lq, dv] -> [B*g, H, Lq, dv]
            out = out.view(n // group, h, group, lq, self.d_v).transpose(1, 2).reshape(
                n, h, lq, self.d_v)
        # [N, H, Lq, dv] -> [N, Lq, H*dv]
        out = out.transpose(1, 2).reshape(n, lq, h * self.d_v)
        return self.out_proj(out)


# torch's batched matrix product on a CPU takes a scalar loop for matrices of fewer than 400
# multiply-adds (ATen's bmm_out_or_baddbmm_), and its softmax over a last dimension narrower
# than a vector register a scalar path too: for short decoder self-attention both cost 5-10
# times what their vectorised paths cost.
SCALAR_BMM_MACS = 400
SOFTMAX_MIN_WIDTH = 16      # float32 lanes of AVX-512 (AVX2's 8 divide it)


def single_query_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                           blocked: Tensor | None = None) -> Tensor:
    """softmax(q k^T / sqrt(dk)) v for incremental decoding on a CPU: one query per decoder row
    (a few per sentence when beams share its keys). SDPA's CPU kernel (flash attention) costs
    2-3 times as much for these shapes: it is built for long queries. Here: a batched matrix
    product, a float32 softmax (over scores padded with -inf to SOFTMAX_MIN_WIDTH columns when
    fewer), and the weighted sum of the values as a broadcast product and sum where the matrix
    product would take its scalar loop. q [N, H, g, dk], k [N, H, L, dk], v [N, H, L, dv],
    mask broadcastable to [N, H, g, L] (True = attend), or ``blocked``, its negation."""
    g, length, dv = q.size(-2), k.size(-2), v.size(-1)
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(q.size(-1) ** -0.5)   # [N, H, g, L]
    if mask is not None:
        blocked = ~mask
    if blocked is not None:
        scores.masked_fill_(blocked, float("-inf"))
    if length < SOFTMAX_MIN_WIDTH:
        wide = scores.new_full((*scores.shape[:-1], SOFTMAX_MIN_WIDTH), float("-inf"))
        wide[..., :length] = scores
        p = torch.softmax(wide, dim=-1, dtype=torch.float32)[..., :length]
    else:
        p = torch.softmax(scores, dim=-1, dtype=torch.float32)
    if p.dtype != v.dtype:
        p = p.to(v.dtype)
    if g * length * dv < SCALAR_BMM_MACS:
        return (p.unsqueeze(-1) * v.unsqueeze(-3)).sum(-2)                     # [N, H, g, dv]
    return torch.matmul(p, v)


# ModelConfig.activation -> function. "gelu" is the exact (erf) GELU, as fairseq's and
# transformers' "gelu"; "swish" is x * sigmoid(x) (SiLU), Marian's and OPUS-MT's.
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (eq. 2), or with another activation than ReLU."""

    def __init__(self, d_model: int, d_ff: int, activation: str, activation_dropout: float):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.act = ACTIVATIONS[activation]
        self.dropout = Dropout(activation_dropout)
        for m in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.dropout(self.act(self.fc1(x))))


class Residual(nn.Module):
    """Post-norm: LayerNorm(x + Dropout(f(x))) as the paper; pre-norm: x + Dropout(f(LayerNorm(x)))."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = Dropout(dropout)
        self.pre_norm = pre_norm

    def before(self, x: Tensor) -> Tensor:
        return self.norm(x) if self.pre_norm else x

    def after(self, x: Tensor, y: Tensor) -> Tensor:
        out = x + self.dropout(y)
        return out if self.pre_norm else self.norm(out)


def embedding_scale(d_model: int) -> float:
    return math.sqrt(d_model)
