"""The Transformer and the architecture registry."""

import math

import pytest
import torch
import torch.nn.functional as F

import nmt
from nmt.config import ModelConfig, apply_overrides, parse_overrides
from nmt.errors import UsageError
from nmt.models.layers import sinusoid_table
from nmt.models.state import SelfAttentionCache
from nmt.models.transformer import BOS, EOS, PAD, count_parameters, parameter_count

V = 40


def batch(seed=0, b=3, s=7, t=6, vocab=V):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (b, s), generator=g)
    src[:, -1] = EOS
    tgt = torch.randint(4, vocab, (b, t), generator=g)
    tgt[:, 0] = BOS
    return src, tgt


@pytest.mark.parametrize("arch", nmt.list_archs())
def test_every_arch_builds_and_trains_one_step(arch):
    torch.manual_seed(0)
    model = nmt.build_model(arch, V, V)
    src, tgt = batch(b=2, s=5, t=4)
    logits = model(src, tgt)
    assert logits.shape == (2, 4, V)
    logits.logsumexp(-1).mean().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)
    assert all(torch.isfinite(g).all() for g in grads)


def test_presets_are_the_papers():
    base = nmt.get_arch("transformer_base")
    assert (base.encoder_layers, base.decoder_layers, base.d_model, base.d_ff, base.heads) == \
        (6, 6, 512, 2048, 8)
    assert (base.head_dim_k, base.head_dim_v, base.dropout, base.label_smoothing) == \
        (64, 64, 0.1, 0.1)
    big = nmt.get_arch("transformer_big")
    assert (big.d_model, big.d_ff, big.heads, big.dropout) == (1024, 4096, 16, 0.3)
    parse = nmt.get_arch("transformer_parse")
    assert (parse.encoder_layers, parse.d_model, parse.beam, parse.lenpen, parse.max_len_b) == \
        (4, 1024, 21, 0.3, 300)
    small = nmt.get_arch("transformer_small")
    assert (small.encoder_layers, small.d_model, small.d_ff, small.heads) == (3, 256, 1024, 4)
    assert (base.beam, base.lenpen, base.max_len_a, base.max_len_b) == (4, 0.6, 1.0, 50)


@pytest.mark.parametrize("arch,expected", [("transformer_base", 63e6), ("transformer_big", 213e6)])
def test_parameter_counts_at_shared_37k_vocab(arch, expected):
    n = parameter_count(nmt.get_arch(arch), 37000)
    assert abs(n - expected) / expected < 0.02, n


def analytic_parameter_count(cfg: ModelConfig, src_vocab: int, tgt_vocab: int,
                             shared: bool) -> int:
    """Weights of a post-norm Transformer with sinusoidal positions, counted by hand.

    Attention: Q, K, V projections d -> h*d_k, h*d_k, h*d_v and the output h*d_v -> d, all with
    biases. FFN: d -> d_ff -> d with biases. LayerNorm: gain and bias (2d), after each
    sublayer (2 per encoder layer, 3 per decoder layer). Embeddings: V x d, the target one also
    the output projection (no bias); one matrix for both sides when shared.
    """
    d, f, h = cfg.d_model, cfg.d_ff, cfg.heads
    dk = cfg.d_k if cfg.d_k is not None else d // h
    dv = cfg.d_v if cfg.d_v is not None else d // h
    attention = d * (2 * h * dk + h * dv) + (2 * h * dk + h * dv) + h * dv * d + d
    ffn = d * f + f + f * d + d
    norm = 2 * d
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    embeddings = src_vocab * d if shared else (src_vocab + tgt_vocab) * d
    return (cfg.encoder_layers * encoder_layer + cfg.decoder_layers * decoder_layer
            + embeddings)


@pytest.mark.parametrize("arch", nmt.list_archs())
def test_parameter_count_of_every_preset_matches_the_formula(arch):
    cfg = nmt.get_arch(arch)
    # the formula's assumptions: what every preset uses
    assert not cfg.pre_norm and cfg.positional == "sinusoidal"
    assert parameter_count(cfg, 37000) == analytic_parameter_count(cfg, 37000, 37000, True)
    assert parameter_count(cfg, 37000, 30000, share_all_embeddings=False) == \
        analytic_parameter_count(cfg, 37000, 30000, False)


def test_parameter_count_formula_by_hand():
    # transformer_base at a shared 37k vocabulary, term by term: 37000*512 embeddings,
    # 6 * (4*512^2 + 4*512 + 2*512*2048 + 2048 + 512 + 4*512) encoder,
    # 6 * (8*512^2 + 8*512 + 2*512*2048 + 2048 + 512 + 6*512) decoder.
    assert analytic_parameter_count(nmt.get_arch("transformer_base"), 37000, 37000, True) == \
        18_944_000 + 6 * 3_152_384 + 6 * 4_204_032 == 63_082_496
    # a real (allocated) model agrees too
    model = nmt.build_model("transformer_tiny", V, V)
    assert count_parameters(model) == sum(p.numel() for p in model.parameters()) == \
        analytic_parameter_count(model.cfg, V, V, True)


def test_shared_embeddings_are_one_matrix():
    model = nmt.build_model("transformer_tiny", V, V, share_all_embeddings=True)
    assert model.src_embed.weight is model.tgt_embed.weight
    separate = nmt.build_model("transformer_tiny", V, V + 5, share_all_embeddings=False)
    assert separate.src_embed.weight is not separate.tgt_embed.weight
    # the projection is the target embedding in both cases
    d = separate.cfg.d_model
    assert count_parameters(separate) - count_parameters(model) == (V + 5) * d
    with pytest.raises(UsageError):
        nmt.build_model("transformer_tiny", V, V + 1, share_all_embeddings=True)


def test_sinusoids_follow_equation_4():
    table = sinusoid_table(50, 16)
    pos, i = 17, 3
    assert table[pos, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / 16)), abs=1e-6)
    assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(pos / 10000 ** (2 * i / 16)),
                                                         abs=1e-6)
    assert table[0, 0].item() == 0.0 and table[0, 1].item() == 1.0


def test_embeddings_scaled_by_sqrt_d_model():
    model = nmt.build_model("transformer_tiny", V, V).eval()
    tok = torch.tensor([[5]])
    x = model._embed(tok, model.src_embed, model.src_pos)
    expected = model.src_embed.weight[5] * math.sqrt(64) + sinusoid_table(1, 64)[0]
    assert torch.allclose(x[0, 0], expected, atol=1e-6)


def test_causality_later_tokens_do_not_change_earlier_outputs():
    torch.manual_seed(0)
    model = nmt.build_model("transformer_tiny", V, V).eval()
    src, tgt = batch()
    out = model(src, tgt)
    changed = tgt.clone()
    changed[:, 4] = (changed[:, 4] + 1 - 4) % (V - 4) + 4
    out2 = model(src, changed)
    assert torch.allclose(out[:, :4], out2[:, :4], atol=1e-6)
    assert not torch.allclose(out[:, 4:], out2[:, 4:], atol=1e-3)


@pytest.mark.parametrize("pre_norm", [False, True])
@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_incremental_decoding_equals_full_forward(pre_norm, positional):
    torch.manual_seed(0)
    cfg = nmt.get_arch("transformer_tiny", {"pre_norm": pre_norm, "positional": positional})
    model = nmt.build_model(cfg, V, V).eval()
    src, tgt = batch()
    src[1, 4:] = PAD
    src[1, 3] = EOS
    full = model(src, tgt)
    logits, state = decode_step_by_step(model, src, tgt)
    assert state.step == tgt.size(1)
    assert torch.allclose(logits, full, atol=1e-5)
    # several new positions at once after a cached prefix
    state = model.init_state(model.encode(src))
    a, state = model.decode(tgt[:, :2], state)
    b, state = model.decode(tgt[:, 2:], state)
    assert torch.allclose(torch.cat([a, b], 1), full, atol=1e-5)


def test_beam_rows_share_encoder_state_and_reorder():
    torch.manual_seed(0)
    model = nmt.build_model("transformer_tiny", V, V).eval()
    src, tgt = batch(b=2)
    beam = 3
    full = model(src.repeat_interleave(beam, 0), tgt.repeat_interleave(beam, 0))
    state = model.init_state(model.encode(src), group=beam)
    rows = tgt.repeat_interleave(beam, 0)
    logits, state = model.decode(rows[:, :3], state)
    assert torch.allclose(logits, full[:, :3], atol=1e-5)
    # reorder inside each sentence: beam k takes beam (k+1) % beam's history
    index = torch.tensor([(b * beam + (k + 1) % beam) for b in range(2) for k in range(beam)])
    state = state.reorder(index)
    logits, state = model.decode(rows[index, 3:4], state)
    assert torch.allclose(logits[:, 0], full[index, 3], atol=1e-5)
    # drop sentence 0
    state = state.select_sentences(torch.tensor([1]))
    logits, _ = model.decode(rows[index][beam:, 4:5], state)
    assert torch.allclose(logits[:, 0], full[index][beam:, 4], atol=1e-5)


def test_padding_invariance():
    torch.manual_seed(0)
    model = nmt.build_model("transformer_tiny", V, V).eval()
    src, tgt = batch(b=2, s=5, t=4)
    alone = model(src, tgt)
    # add a longer sentence pair: the real sentences get padded on both sides
    long_src, long_tgt = batch(seed=1, b=1, s=11, t=9)
    src_p = torch.full((3, 11), PAD)
    tgt_p = torch.full((3, 9), PAD)
    src_p[:2, :5], tgt_p[:2, :4] = src, tgt
    src_p[2], tgt_p[2] = long_src[0], long_tgt[0]
    padded = model(src_p, tgt_p)
    assert torch.allclose(padded[:2, :4], alone, atol=1e-5)


def test_table3_variations_as_overrides():
    cfg = nmt.get_arch("transformer_base", parse_overrides(
        ["heads=16", "d_kv=32", "layers=4", "d_ff=1024", "dropout=0.2", "label_smoothing=0.0",
         "positional=learned"]))
    assert (cfg.heads, cfg.head_dim_k, cfg.head_dim_v, cfg.encoder_layers, cfg.decoder_layers) == \
        (16, 32, 32, 4, 4)
    # row (B): smaller keys only
    cfg_b = nmt.get_arch("transformer_base", {"d_k": 16})
    model = nmt.build_model(cfg_b, V, V)
    assert model.encoder_layers[0].self_attn.in_proj.out_features == 8 * 16 * 2 + 8 * 64
    src, tgt = batch()
    assert model(src, tgt).shape == (3, 6, V)


def test_unknown_arch_and_override_key_are_errors_with_suggestions():
    with pytest.raises(UsageError, match="did you mean 'transformer_base'"):
        nmt.get_arch("transformer_bsae")
    with pytest.raises(UsageError, match="did you mean 'dropout'"):
        nmt.get_arch("transformer_base", {"dropuot": "0.3"})
    with pytest.raises(UsageError, match="expected int"):
        nmt.get_arch("transformer_base", {"heads": "many"})
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_overrides(["dropout"])
    with pytest.raises(UsageError, match="divisible"):
        nmt.get_arch("transformer_base", {"heads": "7"})


def test_config_round_trip():
    cfg = nmt.get_arch("transformer_big", {"dropout": 0.1})
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert apply_overrides(cfg, {}) == cfg


def test_a_consumed_decoder_state_cannot_be_reused():
    """decode/reorder reuse the cache's buffers: the state passed in is stale afterwards."""
    model = nmt.build_model("transformer_tiny", V, V).eval()
    src, tgt = batch(b=2)
    state = model.init_state(model.encode(src))
    _, after = model.decode(tgt[:, :1], state)
    with pytest.raises(RuntimeError, match="already passed to decode"):
        model.decode(tgt[:, :1], state)
    after.reorder(torch.tensor([1, 0]))
    with pytest.raises(RuntimeError, match="already passed to decode"):
        after.select_sentences(torch.tensor([0]))


@torch.inference_mode()
def test_cache_grows_past_its_initial_capacity_and_keeps_earlier_positions():
    torch.manual_seed(0)
    model = nmt.build_model("transformer_tiny", V, V).eval()
    src, tgt = batch(b=3, t=5)
    steps = 2 * SelfAttentionCache.INITIAL_CAPACITY + 3
    tgt = torch.randint(4, V, (3, steps))
    full = model(src, tgt)
    state = model.init_state(model.encode(src), group=1)
    out = []
    for t in range(steps):
        if t == 7:      # drop a sentence on the way: fewer rows, same positions
            state = state.select_sentences(torch.tensor([0, 2]))
            full = full[[0, 2]]
            tgt = tgt[[0, 2]]
            out = [o[[0, 2]] for o in out]
        logits, state = model.decode(tgt[:, t:t + 1], state)
        out.append(logits)
    assert state.cache.capacity >= steps
    assert torch.allclose(torch.cat(out, 1), full, atol=1e-5)


def decode_step_by_step(model, src, prev):
    """The decoder's logits for ``prev`` one position at a time through its KV cache,
    [B, T, V], and the final state."""
    state = model.init_state(model.encode(src))
    steps = []
    for t in range(prev.size(1)):
        logits, state = model.decode(prev[:, t:t + 1], state)
        steps.append(logits)
    return torch.cat(steps, 1), state


def test_cudnn_attention_is_switched_off_once_and_only_for_cuda(caplog):
    """nmt's attention turns torch's cuDNN attention off before its first CUDA call (cuDNN
    plans every new shape: ~4 ms of CPU per call, BENCHMARKS.md "GPU checks"); on a CPU the
    flag is left alone."""
    import logging

    from nmt.models.layers import avoid_cudnn_attention

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        model = nmt.build_model(nmt.get_arch("transformer_tiny"), 20, 20).eval()
        tokens = torch.tensor([[5, 6, 7, 2]])
        model(tokens, tokens)                                  # CPU attention
        assert torch.backends.cuda.cudnn_sdp_enabled()
        with caplog.at_level(logging.INFO, logger="nmt"):
            avoid_cudnn_attention()
            avoid_cudnn_attention()
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert caplog.text.count("cuDNN attention switched off") == 1
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


@pytest.mark.parametrize("length", [1, 3, 15, 16, 17, 40])
@pytest.mark.parametrize("group", [1, 4])
def test_single_query_attention_equals_sdpa_on_every_path(length, group):
    """Short keys take the padded softmax and the broadcast weighted sum, long ones the plain
    softmax and the matrix product; with a padding mask, time-major (strided) keys as the
    cache gives them, and several query rows sharing one key row."""
    from nmt.models.layers import single_query_attention

    g = torch.Generator().manual_seed(length * 10 + group)
    n, h, dk = 6, 4, 16
    q = torch.randn(n, h, group, dk, generator=g)
    store = torch.randn(length, n, 2 * h * dk, generator=g)       # [L, N, keys | values]
    k = store[..., :h * dk].view(length, n, h, dk).permute(1, 2, 0, 3)
    v = store[..., h * dk:].view(length, n, h, dk).permute(1, 2, 0, 3)
    mask = torch.rand(n, 1, 1, length, generator=g) > 0.3
    mask[..., 0] = True
    for m in (None, mask):
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        got = single_query_attention(q, k, v, m)
        assert got.shape == want.shape
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-5)
