"""The Transformer of "Attention Is All You Need" (section 3), with explicit incremental decoding.

    model = build_model("transformer_base", 37000, 37000)       # shared vocabulary
    logits = model(src_tokens, prev_output_tokens)               # [B, T, V], training
    enc = model.encode(src_tokens)                               # inference
    state = model.init_state(enc, group=beam)
    logits, state = model.decode(prev_tokens, state)             # one (or more) new steps
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from nmt.config import ModelConfig
from nmt.errors import UsageError
from nmt.models.dropout import Dropout
from nmt.models.layers import (FeedForward, LearnedPositions, MultiHeadAttention, Residual,
                               SinusoidalPositions, embedding_scale)
from nmt.models.state import DecoderState, EncoderOut, SelfAttentionCache

from nmt.specials import BOS, EOS, PAD, UNK  # noqa: F401 (re-exported)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.self_attn = MultiHeadAttention(d, cfg.heads, cfg.head_dim_k, cfg.head_dim_v,
                                            cfg.attention_dropout, self_attention=True)
        self.ffn = FeedForward(d, cfg.d_ff, cfg.activation, cfg.activation_dropout)
        self.res1 = Residual(d, cfg.dropout, cfg.pre_norm, cfg.layer_norm_eps)
        self.res2 = Residual(d, cfg.dropout, cfg.pre_norm, cfg.layer_norm_eps)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """x [B, S, D]; mask [B, 1, 1, S] (True = attend) or None."""
        q, k, v = self.self_attn.project_qkv(self.res1.before(x))
        x = self.res1.after(x, self.self_attn.attend(q, k, v, mask))
        return self.res2.after(x, self.ffn(self.res2.before(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.self_attn = MultiHeadAttention(d, cfg.heads, cfg.head_dim_k, cfg.head_dim_v,
                                            cfg.attention_dropout, self_attention=True)
        self.cross_attn = MultiHeadAttention(d, cfg.heads, cfg.head_dim_k, cfg.head_dim_v,
                                             cfg.attention_dropout, self_attention=False)
        self.ffn = FeedForward(d, cfg.d_ff, cfg.activation, cfg.activation_dropout)
        self.res1 = Residual(d, cfg.dropout, cfg.pre_norm, cfg.layer_norm_eps)
        self.res2 = Residual(d, cfg.dropout, cfg.pre_norm, cfg.layer_norm_eps)
        self.res3 = Residual(d, cfg.dropout, cfg.pre_norm, cfg.layer_norm_eps)

    def forward(self, x: Tensor, cache: SelfAttentionCache | None, layer: int,
                cross_k: Tensor, cross_v: Tensor, memory_mask: Tensor | None,
                group: int) -> Tensor:
        """One decoder layer over t new positions.

        x [N, t, D] for the new positions; ``cache`` holds the self-attention keys/values of
        the earlier positions (this layer's are number ``layer``) and receives the new ones;
        None on a full, non-incremental pass. cross_k/cross_v [N/group, H, S, dk/dv].
        """
        t = x.size(1)
        attn = self.self_attn
        h = self.res1.before(x)
        if cache is None:
            q, k, v = attn.project_qkv(h)
            step = 0
        else:
            step = cache.length
            q, kv = attn.project_q_kv(h)
            k_all, v_all = cache.write(layer, kv)
            k, v = attn.heads_of(k_all, attn.d_k), attn.heads_of(v_all, attn.d_v)
        if step == 0:
            # Queries and keys cover the same positions: the plain causal mask.
            y = attn.attend(q, k, v, causal=t > 1)
        elif t == 1:
            # One new position may see every cached one: no mask at all.
            y = attn.attend(q, k, v)
        else:
            # t new positions after `step` cached ones: query i sees keys 0 .. step + i.
            allowed = torch.ones(t, step + t, dtype=torch.bool, device=x.device).tril(step)
            y = attn.attend(q, k, v, mask=allowed)
        x = self.res1.after(x, y)

        qc = self.cross_attn.project_q(self.res2.before(x))
        x = self.res2.after(x, self.cross_attn.attend(qc, cross_k, cross_v, memory_mask,
                                                      group=group))
        return self.res3.after(x, self.ffn(self.res3.before(x)))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
                 share_all_embeddings: bool = True, pad_idx: int = PAD):
        super().__init__()
        if share_all_embeddings and src_vocab_size != tgt_vocab_size:
            raise UsageError(f"share_all_embeddings needs one joined vocabulary, but the source "
                             f"has {src_vocab_size} symbols and the target {tgt_vocab_size}")
        self.cfg = cfg
        self.pad_idx = pad_idx
        self.share_all_embeddings = share_all_embeddings
        d = cfg.d_model
        self.embed_scale = embedding_scale(d) if cfg.scale_embedding else 1.0
        self.tgt_embed = self._embedding(tgt_vocab_size, d, pad_idx)
        # Section 3.4: one matrix for both embeddings and the pre-softmax projection when the
        # vocabulary is joined; otherwise the target embedding is still tied to the projection,
        # unless tie_output is off (a separate output matrix, as some imported models have).
        self.src_embed = self.tgt_embed if share_all_embeddings else self._embedding(
            src_vocab_size, d, pad_idx)
        self.output_weight = None if cfg.tie_output else nn.Parameter(
            self._embedding(tgt_vocab_size, d, pad_idx).weight.detach())
        self.output_bias = nn.Parameter(torch.zeros(tgt_vocab_size)) if cfg.output_bias else None
        if cfg.positional == "sinusoidal":
            self.src_pos: nn.Module = SinusoidalPositions(d, cfg.max_positions,
                                                          cfg.sinusoid_layout, cfg.position_offset)
            self.tgt_pos: nn.Module = SinusoidalPositions(d, cfg.max_positions,
                                                          cfg.sinusoid_layout, cfg.position_offset)
        else:
            self.src_pos = LearnedPositions(d, cfg.max_positions, cfg.position_offset)
            self.tgt_pos = LearnedPositions(d, cfg.max_positions, cfg.position_offset)
        # fairseq's layernorm_embedding: normalise embeddings + positions before the dropout.
        self.src_embed_norm = (nn.LayerNorm(d, eps=cfg.layer_norm_eps)
                               if cfg.layernorm_embedding else None)
        self.tgt_embed_norm = (nn.LayerNorm(d, eps=cfg.layer_norm_eps)
                               if cfg.layernorm_embedding else None)
        self.dropout = Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        # Pre-norm stacks end with a LayerNorm; post-norm ones already end normalised.
        self.encoder_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps) if cfg.pre_norm else None
        self.decoder_norm = nn.LayerNorm(d, eps=cfg.layer_norm_eps) if cfg.pre_norm else None
        # int8 decoding only (nmt.models.quantize): a quantized copy of the tied output
        # projection. None otherwise, so training, fp32/bf16/fp16 and checkpoints never see it.
        self.quantized_output: nn.Module | None = None
        # CPU decoding in fp32/bf16 (nmt.models.packed): a copy of the projection packed for
        # oneDNN. None otherwise.
        self.packed_output: nn.Module | None = None

    @staticmethod
    def _embedding(n: int, d: int, pad_idx: int) -> nn.Embedding:
        emb = nn.Embedding(n, d, padding_idx=pad_idx)
        nn.init.normal_(emb.weight, mean=0.0, std=d ** -0.5)
        with torch.no_grad():
            emb.weight[pad_idx].zero_()
        return emb

    @property
    def start_token(self) -> int:
        """The id the decoder reads first (ModelConfig.decoder_start)."""
        return self.cfg.start_id

    @property
    def max_positions(self) -> int | None:
        """Longest sequence the model accepts, or None when sinusoids make it unbounded."""
        return self.cfg.max_positions if self.cfg.positional == "learned" else None

    # --- encoder --------------------------------------------------------------------------------
    def _embed(self, tokens: Tensor, emb: nn.Embedding, pos: nn.Module,
               norm: nn.Module | None = None, offset: int = 0) -> Tensor:
        """Scaled embeddings plus positional encodings, then dropout: [N, L] -> [N, L, D]."""
        x = emb(tokens)
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        x = x + pos(tokens.size(1), offset).to(emb.weight.dtype)
        if norm is not None:
            x = norm(x)
        return self.dropout(x)

    def encode(self, src_tokens: Tensor) -> EncoderOut:
        """src_tokens [B, S] (right-padded, each row ending in eos) -> EncoderOut."""
        pad_mask = src_tokens.eq(self.pad_idx)                         # [B, S]
        enc = EncoderOut(src_tokens.new_zeros(0), pad_mask)
        mask = enc.attn_mask()                                         # [B, 1, 1, S] or None
        x = self._embed(src_tokens, self.src_embed, self.src_pos, self.src_embed_norm)
        for layer in self.encoder_layers:
            x = layer(x, mask)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        enc.out = x
        return enc

    # --- decoder --------------------------------------------------------------------------------
    def init_state(self, enc: EncoderOut, group: int = 1) -> DecoderState:
        """Decoder state before the first step: encoder-decoder keys/values computed once.

        ``group`` decoder rows (beams) per sentence share them; see nmt.models.state.
        """
        cross_k, cross_v = [], []
        for layer in self.decoder_layers:
            k, v = layer.cross_attn.project_kv(enc.out)                # [B, H, S, dk/dv]
            # contiguous once: attention's batched matrix products would copy these views
            # at every step
            cross_k.append(k.contiguous())
            cross_v.append(v.contiguous())
        cfg = self.cfg
        cache = SelfAttentionCache(len(self.decoder_layers), enc.out.size(0) * group,
                                   cfg.heads * cfg.head_dim_k, cfg.heads * cfg.head_dim_v)
        return DecoderState(cache=cache, cross_k=cross_k, cross_v=cross_v,
                            memory_mask=enc.attn_mask(), group=group)

    def decode(self, prev_tokens: Tensor, state: DecoderState,
               return_hidden: bool = False) -> tuple[Tensor, DecoderState]:
        """Run the decoder over the new tokens ``prev_tokens`` [N, t] given ``state``.

        Returns logits [N, t, V] for the t new positions and the state extended by t steps.
        """
        x = self._embed(prev_tokens, self.tgt_embed, self.tgt_pos, self.tgt_embed_norm,
                        offset=state.step)
        cache = state.take()
        for i, layer in enumerate(self.decoder_layers):
            x = layer(x, cache, i, state.cross_k[i], state.cross_v[i], state.memory_mask,
                      state.group)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        new_state = state.advanced(cache, prev_tokens.size(1))
        out = x if return_hidden else self.output_projection(x)
        return out, new_state

    @property
    def projection_weight(self) -> Tensor:
        """[V, D] matrix of the pre-softmax projection: the target embedding when tied."""
        return self.tgt_embed.weight if self.output_weight is None else self.output_weight

    def output_projection(self, x: Tensor) -> Tensor:
        """Pre-softmax projection (tied to the target embedding unless tie_output is off), plus
        the output bias if the model has one: [N, t, D] -> [N, t, V].

        After nmt.models.quantize.quantize_int8 it runs on an int8 copy of the projection matrix
        (the embedding lookups keep the float one)."""
        if self.quantized_output is not None:
            logits = self.quantized_output(x)
        elif self.packed_output is not None:
            logits = self.packed_output(x)
        else:
            logits = nn.functional.linear(x, self.projection_weight)
        if self.output_bias is not None:
            logits = logits + self.output_bias.to(logits.dtype)
        return logits

    def decode_full(self, prev_output_tokens: Tensor, enc: EncoderOut,
                    return_hidden: bool = False) -> Tensor:
        """Teacher-forced decoder pass over whole target prefixes [B, T] (training)."""
        x = self._embed(prev_output_tokens, self.tgt_embed, self.tgt_pos, self.tgt_embed_norm)
        mask = enc.attn_mask()
        for layer in self.decoder_layers:
            cross_k, cross_v = layer.cross_attn.project_kv(enc.out)
            x = layer(x, None, 0, cross_k, cross_v, mask, group=1)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return x if return_hidden else self.output_projection(x)

    def forward(self, src_tokens: Tensor, prev_output_tokens: Tensor,
                return_hidden: bool = False) -> Tensor:
        """src_tokens [B, S], prev_output_tokens [B, T] -> logits [B, T, V].

        With ``return_hidden`` the decoder's final hidden states [B, T, D] are returned instead,
        so that a loss can project only the non-padding positions.
        """
        return self.decode_full(prev_output_tokens, self.encode(src_tokens), return_hidden)


def build_model(arch_or_config: str | ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
                share_all_embeddings: bool = True, pad_idx: int = PAD) -> Transformer:
    """Build a Transformer from a registered architecture name or a ModelConfig."""
    from nmt.registry import get_arch

    cfg = get_arch(arch_or_config) if isinstance(arch_or_config, str) else arch_or_config
    if src_vocab_size < 4 or tgt_vocab_size < 4:
        raise UsageError("vocabulary sizes must include the 4 special symbols")
    return Transformer(cfg, src_vocab_size, tgt_vocab_size, share_all_embeddings, pad_idx)


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared tensor counted once."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class _NoRandomInit(TorchFunctionMode):
    """Random initialization as a no-op: on the meta device it has nothing to fill, and torch
    runs it there through python decompositions that take seconds to import."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in ("normal_", "uniform_"):
            return args[0] if args else kwargs.get("tensor", kwargs.get("self"))
        return func(*args, **kwargs)


def meta_model(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int,
               share_all_embeddings: bool = True) -> Transformer:
    """The model ``cfg`` describes on the meta device: every parameter's name and shape, no
    storage, so nothing is allocated whatever the sizes (a checkpoint's are checked on it)."""
    with torch.device("meta"), _NoRandomInit():
        return Transformer(cfg, src_vocab_size, tgt_vocab_size, share_all_embeddings)


def parameter_count(cfg: ModelConfig, src_vocab_size: int, tgt_vocab_size: int | None = None,
                    share_all_embeddings: bool = True) -> int:
    """Parameter count of a config without allocating its weights (built on the meta device)."""
    tgt = src_vocab_size if tgt_vocab_size is None else tgt_vocab_size
    return count_parameters(meta_model(cfg, src_vocab_size, tgt, share_all_embeddings))
