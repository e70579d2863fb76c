"""The Transformer of "Attention Is All You Need" (section 3), with explicit incremental decoding.

    model = build_model("transformer_base", 37000, 37000)       # shared vocabulary
    logits = model(src_tokens, prev_output_tokens)               # [B, T, V], training
    enc = model.encode(src_tokens)                               # inference
    state = model.init_state(enc, group=beam)
    logits, state = model.decode(prev_tokens, state)             # one (or more) new steps
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from nmt.config import ModelConfig
from nmt.errors import UsageError
from nmt.models.dropout import Dropout
from nmt.models.layers import (FeedForward, LearnedPositions, MultiHeadAttention, Residual,
                               SinusoidalPositions, embedding_scale, single_query_attention)
from nmt.models.packed import PackedLinear
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

    def step(self, x: Tensor, cache: SelfAttentionCache, layer: int, cross_k: Tensor,
             cross_v: Tensor, memory_blocked: Tensor | None, group: int) -> Tensor:
        """``forward`` for one new position, in eval mode on a CPU: x [N, D] -> [N, D].

        The same products and reductions on the same values as forward (its output bit for
        bit), with the work a decoding step does not need left out: no dropout calls, no
        module calls, [N, D] rows instead of [N, 1, D] sequences, the cache's views made
        once, and the padding mask negated once per batch (``memory_blocked``)."""
        attn, cross = self.self_attn, self.cross_attn
        pre = self.res1.pre_norm
        n, heads = x.size(0), attn.heads
        h = _norm(self.res1.norm, x) if pre else x
        proj = _linear(attn.in_proj, h)                                   # [N, 2*qk + v]
        qk = heads * attn.d_k
        k_all, v_all = cache.write_one(layer, proj[:, qk:])
        y = single_query_attention(proj[:, :qk].view(n, heads, 1, attn.d_k),
                                   attn.heads_of(k_all, attn.d_k),
                                   attn.heads_of(v_all, attn.d_v), None)  # [N, H, 1, dv]
        x = _residual(self.res1, x, _linear(attn.out_proj, y.view(n, -1)))

        h = _norm(self.res2.norm, x) if pre else x
        q = _linear(cross.q_proj, h).view(n, heads, 1, cross.d_k)
        if group > 1:      # the beams of a sentence share its keys: [B, H, g, dk]
            q = q.view(n // group, group, heads, cross.d_k).transpose(1, 2)
        y = single_query_attention(q, cross_k, cross_v, None, memory_blocked)
        if group > 1:
            y = y.transpose(1, 2)                                         # [B, g, H, dv]
        x = _residual(self.res2, x, _linear(cross.out_proj, y.reshape(n, -1)))

        h = _norm(self.res3.norm, x) if pre else x
        ffn = self.ffn
        if ffn.act is F.relu:
            h = _linear_relu(ffn.fc1, h)
        else:
            h = ffn.act(_linear(ffn.fc1, h))
        return _residual(self.res3, x, _linear(ffn.fc2, h))


def _linear(m: nn.Module, x: Tensor) -> Tensor:
    """``m(x)`` without the module call: ``F.linear`` for a plain nn.Linear, else (packed
    or int8 layers) the module's own forward."""
    if type(m) is nn.Linear:
        return F.linear(x, m.weight, m.bias)
    return m.forward(x)


def _linear_relu(m: nn.Module, x: Tensor) -> Tensor:
    """relu(m(x)): in the product's own output, or by oneDNN as the product's last step for a
    packed layer (the same values: max(0, y) of the same y)."""
    if isinstance(m, PackedLinear):
        return m.forward(x, "relu")
    return _linear(m, x).relu_()


def _norm(m: nn.LayerNorm, x: Tensor) -> Tensor:
    return F.layer_norm(x, m.normalized_shape, m.weight, m.bias, m.eps)


def _residual(res: Residual, x: Tensor, y: Tensor) -> Tensor:
    """``res.after(x, y)`` in eval mode (its dropout is the identity)."""
    return x + y if res.pre_norm else _norm(res.norm, x + y)


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
        # One new position in eval mode on a CPU goes through DecoderLayer.step (the same
        # values as the general path; tests turn this off to compare the two).
        self.fast_step = True

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
        if (self.fast_step and prev_tokens.size(1) == 1 and not self.training
                and prev_tokens.device.type == "cpu"):
            return self._decode_one(prev_tokens, state, return_hidden)
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

    def _decode_one(self, prev_tokens: Tensor, state: DecoderState,
                    return_hidden: bool) -> tuple[Tensor, DecoderState]:
        """``decode`` of one new position in eval mode on a CPU, through DecoderLayer.step:
        the same values, fewer operations per step."""
        emb = self.tgt_embed
        x = F.embedding(prev_tokens[:, 0], emb.weight)                   # [N, D]
        if self.embed_scale != 1.0:
            x = x * self.embed_scale
        x = x + self.tgt_pos(1, state.step).to(emb.weight.dtype)
        if self.tgt_embed_norm is not None:
            x = _norm(self.tgt_embed_norm, x)
        cache = state.take()
        for i, layer in enumerate(self.decoder_layers):
            x = layer.step(x, cache, i, state.cross_k[i], state.cross_v[i],
                           state.memory_blocked, state.group)
        if self.decoder_norm is not None:
            x = _norm(self.decoder_norm, x)
        new_state = state.advanced(cache, 1)
        out = x if return_hidden else self.output_projection(x)
        return out.unsqueeze(1), new_state

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
