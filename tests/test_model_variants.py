"""The model variants imported models need: activation, embedding scaling, sinusoid
layouts, position offsets, layernorm_embedding, output bias, untied output projection, the
decoder start symbol and the length penalty formulas. Defaults are the paper's: a model built
with every new field at its default is today's model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import nmt
from nmt.checkpoint import load_model_from_checkpoint, make_checkpoint
from nmt.config import ModelConfig
from nmt.data.buckets import collate
from nmt.data.codec import whitespace_codec
from nmt.data.dictionary import Dictionary
from nmt.models.layers import sinusoid_table
from nmt.models.quantize import quantize_int8
from nmt.search.ensemble import EnsembleModel
from nmt.search.generator import SearchConfig, beam_search
from nmt.specials import BOS, EOS, PAD
from test_model import decode_step_by_step

V = 30
NEW_FIELDS = {"activation": "relu", "scale_embedding": True, "sinusoid_layout": "interleaved",
              "position_offset": 0, "layernorm_embedding": False, "output_bias": False,
              "tie_output": True, "decoder_start": "bos", "lenpen_formula": "gnmt"}
EVERYTHING = {"activation": "swish", "scale_embedding": False, "sinusoid_layout": "fairseq",
              "position_offset": 2, "layernorm_embedding": True, "output_bias": True,
              "tie_output": False, "decoder_start": "eos"}


def tiny(seed=0, **fields) -> nmt.models.Transformer:
    torch.manual_seed(seed)
    cfg = nmt.get_arch("transformer_tiny", fields)
    model = nmt.build_model(cfg, V, V).eval()
    with torch.no_grad():      # non-zero norms and biases, so that each one matters
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.3)
    return model


def batch(seed=0, b=3, s=7, t=6):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (b, s), generator=g)
    src[:, -1] = EOS
    src[1, 4:] = PAD
    src[1, 3] = EOS
    prev = torch.randint(4, V, (b, t), generator=g)
    return src, prev


def test_defaults_are_todays_model_and_old_checkpoints_load():
    assert {k: getattr(ModelConfig(), k) for k in NEW_FIELDS} == NEW_FIELDS
    model = tiny()
    # a checkpoint written before these fields existed: its model_config lacks them
    codec = whitespace_codec(Dictionary([f"w{i}" for i in range(V - 4)]))
    ckpt = make_checkpoint(model_config=model.cfg, model_state=model.state_dict(),
                           share_all_embeddings=True, src_codec=codec, tgt_codec=codec)
    for k in NEW_FIELDS:
        del ckpt["model_config"][k]
    old, _ = load_model_from_checkpoint(ckpt)
    assert set(old.state_dict()) == set(model.state_dict())
    assert not any(k.startswith(("output_", "src_embed_norm", "tgt_embed_norm"))
                   for k in old.state_dict())
    src, prev = batch()
    prev[:, 0] = BOS
    assert torch.equal(old(src, prev), model(src, prev))


@pytest.mark.parametrize("activation,fn", [
    ("swish", lambda x: x * torch.sigmoid(x)),
    ("gelu", lambda x: 0.5 * x * (1 + torch.erf(x / 2 ** .5))),
    ("relu", lambda x: x.clamp(min=0))])
def test_activation(activation, fn):
    ffn = tiny(activation=activation).encoder_layers[0].ffn
    x = torch.randn(5, 64)
    want = ffn.fc2(fn(ffn.fc1(x)))
    assert torch.allclose(ffn(x), want, atol=1e-5)


def test_scale_embedding_off_and_layernorm_embedding():
    tok = torch.tensor([[5, 7]])
    plain = tiny(scale_embedding=False)
    x = plain._embed(tok, plain.src_embed, plain.src_pos)
    assert torch.equal(x, (plain.src_embed.weight[[5, 7]] + sinusoid_table(2, 64))[None])
    normed = tiny(layernorm_embedding=True)
    y = normed._embed(tok, normed.tgt_embed, normed.tgt_pos, normed.tgt_embed_norm)
    ln = normed.tgt_embed_norm
    want = F.layer_norm(normed.tgt_embed.weight[[5, 7]] * 8.0 + sinusoid_table(2, 64), (64,),
                        ln.weight, ln.bias, 1e-5)
    assert torch.allclose(y, want[None], atol=1e-6)
    assert not torch.allclose(y, normed._embed(tok, normed.tgt_embed, normed.tgt_pos), atol=1e-3)


def fairseq_reference(num, dim, padding_idx):
    """fairseq's SinusoidalPositionalEmbedding.get_embedding, as fairseq 0.12.2 writes it."""
    half = dim // 2
    emb = math.log(10000) / (half - 1)
    emb = torch.exp(torch.arange(half, dtype=torch.float) * -emb)
    emb = torch.arange(num, dtype=torch.float).unsqueeze(1) * emb.unsqueeze(0)
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=1).view(num, -1)
    if dim % 2 == 1:
        emb = torch.cat([emb, torch.zeros(num, 1)], dim=1)
    emb[padding_idx, :] = 0
    return emb


def marian_reference(n_pos, dim):
    """transformers' MarianSinusoidalPositionalEmbedding.create_weight, as it writes it."""
    position_enc = np.array(
        [[pos / np.power(10000, 2 * (j // 2) / dim) for j in range(dim)] for pos in range(n_pos)])
    out = torch.empty(n_pos, dim)
    sentinel = dim // 2 if dim % 2 == 0 else (dim // 2) + 1
    out[:, 0:sentinel] = torch.FloatTensor(np.sin(position_enc[:, 0::2]))
    out[:, sentinel:] = torch.FloatTensor(np.cos(position_enc[:, 1::2]))
    return out


@pytest.mark.parametrize("dim", [16, 64, 15])
def test_sinusoid_layouts_are_the_toolkits_tables_bit_for_bit(dim):
    # fairseq: positions start after padding_idx (1), so position p reads row p + 2
    assert torch.equal(sinusoid_table(60, dim, offset=2, layout="fairseq"),
                       fairseq_reference(62, dim, padding_idx=1)[2:])
    assert torch.equal(sinusoid_table(80, dim, layout="marian"), marian_reference(80, dim))
    # the offset shifts the table, whatever the layout
    for layout in ("interleaved", "fairseq", "marian"):
        assert torch.equal(sinusoid_table(10, dim, offset=3, layout=layout),
                           sinusoid_table(13, dim, layout=layout)[3:])
    with pytest.raises(ValueError, match="unknown sinusoid layout"):
        sinusoid_table(4, dim, layout="halves")


def test_marian_layout_equals_transformers_own_table():
    pytest.importorskip("transformers")
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    emb = MarianSinusoidalPositionalEmbedding(70, 32)
    assert torch.equal(sinusoid_table(70, 32, layout="marian"), emb.create_weight())


def test_learned_positions_with_an_offset_read_row_p_plus_offset():
    model = tiny(positional="learned", position_offset=2)
    pos = model.src_pos
    assert pos.weight.shape == (512 + 2, 64)
    assert torch.equal(pos(3, offset=1), pos.weight[3:6])
    with pytest.raises(ValueError, match="exceeds max_positions"):
        pos(2, offset=511)


def test_output_bias_and_untied_output_projection():
    src, prev = batch()
    base = tiny(seed=1)
    biased = nmt.build_model(nmt.get_arch("transformer_tiny", {"output_bias": True}), V, V).eval()
    biased.load_state_dict({**base.state_dict(), "output_bias": torch.randn(V)})
    assert torch.allclose(biased(src, prev), base(src, prev) + biased.output_bias, atol=1e-5)
    untied = tiny(seed=2, tie_output=False)
    assert untied.output_weight is not None and "output_weight" in untied.state_dict()
    assert untied.output_weight.data_ptr() != untied.tgt_embed.weight.data_ptr()
    hidden = untied(src, prev, return_hidden=True)
    assert torch.allclose(untied(src, prev), hidden @ untied.output_weight.T, atol=1e-5)
    with torch.no_grad():
        untied.tgt_embed.weight[10:].zero_()      # the embedding no longer decides the logits
    assert torch.allclose(untied.output_projection(hidden), hidden @ untied.output_weight.T)


def test_every_variant_at_once_decodes_incrementally_as_the_full_forward():
    model = tiny(**EVERYTHING)
    src, prev = batch()
    full = model(src, prev)
    assert torch.allclose(decode_step_by_step(model, src, prev)[0], full, atol=1e-5)
    # int8 quantizes the untied projection, and adds the bias after it
    q = quantize_int8(tiny(**EVERYTHING))
    assert torch.allclose(q(src, prev), full, atol=0.15)
    assert not torch.allclose(q(src, prev) - model.output_bias, full, atol=0.15)


def greedy_by_hand(model, src, start, steps):
    """Plain greedy decoding from ``start``, no cache: the argmax over all but pad and bos."""
    out = torch.full((src.size(0), 1), start)
    for _ in range(steps):
        logits = model(src, out)[:, -1]
        logits[:, [PAD, BOS]] = float("-inf")
        out = torch.cat([out, logits.argmax(-1, keepdim=True)], 1)
    return out[:, 1:]


@pytest.mark.parametrize("start", ["pad", "eos", "bos"])
def test_search_and_training_start_from_the_models_start_symbol(start):
    model = tiny(seed=3, decoder_start=start, output_bias=True)
    with torch.no_grad():       # no eos: every hypothesis runs to the length limit
        model.output_bias[EOS] = -1e4
    src, _ = batch(seed=4)
    cfg = SearchConfig(beam=1, lenpen=0.0, max_len_a=0.0, max_len_b=5)
    hyps = beam_search(EnsembleModel([model]), src, cfg)
    got = torch.tensor([h[0].tokens[:5] for h in hyps])
    start_id = {"pad": PAD, "eos": EOS, "bos": BOS}[start]
    assert torch.equal(got, greedy_by_hand(model, src, start_id, 5))
    other = BOS if start != "bos" else EOS
    assert not torch.equal(got, greedy_by_hand(model, src, other, 5))

    class Data:
        src_sizes, tgt_sizes = np.array([2]), np.array([3])
        src = staticmethod(lambda i: np.array([5, 6]))
        tgt = staticmethod(lambda i: np.array([7, 8, 9]))

    b = collate(Data(), [0], start=model.start_token)
    assert b.prev_output_tokens.tolist() == [[start_id, 7, 8, 9]]


def test_an_ensemble_needs_one_start_symbol():
    with pytest.raises(nmt.errors.NmtError, match="same symbol"):
        EnsembleModel([tiny(decoder_start="pad"), tiny()]).start_token
