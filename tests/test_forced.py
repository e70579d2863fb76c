"""nmt.search.forced: teacher-forced scores of given pairs, and attention alignments."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import nmt
from nmt.data.codec import whitespace_codec
from nmt.data.dictionary import Dictionary
from nmt.errors import NmtError, UsageError
from nmt.search.forced import (PairScore, align, align_lines, attention_weights, score_ids,
                               score_pairs, to_pharaoh, word_indices, words_alignment)
from nmt.search.translator import BatchConfig, SearchConfig, Translator

from test_translator import make_checkpoint, mixed_lines

EOS = 2


@pytest.fixture(scope="module")
def reversal():
    """A tiny Transformer trained (own loop, ~300 Adam steps, a few seconds) to reverse
    sequences of 24 words; returns its Translator and held-out pairs (ids)."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    codec = whitespace_codec(Dictionary([f"w{i}" for i in range(24)]))
    vocab = len(codec.dictionary)
    model = nmt.build_model(nmt.get_arch("transformer_tiny", {"dropout": 0.0}), vocab, vocab)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98))

    def sample(n):
        return [rng.integers(4, vocab, int(rng.integers(2, 9))) for _ in range(n)]

    model.train()
    for _ in range(300):
        srcs = sample(32)
        width = max(s.size for s in srcs) + 1
        src, prev, gold = (torch.zeros(len(srcs), width, dtype=torch.long) for _ in range(3))
        for r, s in enumerate(srcs):
            n = s.size
            src[r, :n], src[r, n] = torch.from_numpy(s), EOS
            prev[r, 0], prev[r, 1:n + 1] = 1, torch.from_numpy(s[::-1].copy())
            gold[r, :n], gold[r, n] = torch.from_numpy(s[::-1].copy()), EOS
        loss = torch.nn.functional.cross_entropy(model(src, prev).reshape(-1, vocab),
                                                 gold.reshape(-1), ignore_index=0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    t = Translator([model], codec, codec, search=SearchConfig(beam=4))
    srcs = sample(30)
    return t, srcs, [s[::-1].copy() for s in srcs]


# --- scores ------------------------------------------------------------------------------------

@pytest.mark.parametrize("alpha", [0.6, 0.0, 1.0])
def test_scoring_the_beam_output_gives_the_beam_score(ckpt, alpha):
    t = Translator.from_checkpoint(ckpt, search=SearchConfig(beam=4, nbest=3, lenpen=alpha))
    lines = [x for x in mixed_lines(20, seed=2) if x.strip()]
    results = t.translate_results(lines)
    src, tgt, hyps = [], [], []
    for line, r in zip(lines, results):
        for h in r.hypotheses:
            src.append(line)
            tgt.append(h.text)
            hyps.append(h)
    scores = score_pairs(t, src, tgt)
    assert [s.index for s in scores] == list(range(len(hyps)))
    for s, h in zip(scores, hyps):
        assert s.n_tokens == len(h.ids)
        assert s.token_scores == pytest.approx(h.token_scores, abs=1e-4)
        assert s.score == pytest.approx(h.score, abs=1e-4)
        assert s.log_prob == pytest.approx(sum(h.token_scores), abs=1e-4)
        assert s.per_token == pytest.approx(s.log_prob / s.n_tokens, rel=1e-6)
    # the same from ids, and with another alpha asked for explicitly
    by_ids = score_ids(t, [t.src_codec.encode(x) for x in src], [h.ids[:-1] for h in hyps])
    assert [s.score for s in by_ids] == pytest.approx([s.score for s in scores], abs=1e-5)
    other = score_ids(t, [t.src_codec.encode(x) for x in src], [h.ids[:-1] for h in hyps],
                      lenpen=0.0)
    assert [s.score for s in other] == pytest.approx([s.log_prob for s in scores], abs=1e-5)


def test_ensemble_scores_are_the_ensemble_beam_scores(tmp_path, ckpt):
    other = make_checkpoint(tmp_path / "other.pt", seed=3)
    t = Translator.from_checkpoint([ckpt, other], search=SearchConfig(beam=3, nbest=2))
    lines = [x for x in mixed_lines(10, seed=5) if x.strip()]
    hyps = [(line, h) for line, r in zip(lines, t.translate_results(lines)) for h in r.hypotheses]
    scores = score_ids(t, [t.src_codec.encode(x) for x, _ in hyps], [h.ids[:-1] for _, h in hyps])
    assert [s.score for s in scores] == pytest.approx([h.score for _, h in hyps], abs=1e-4)
    # the mean of the probabilities, not of the log-probabilities
    singles = [score_ids(Translator.from_checkpoint(p), [[5, 6, 7]], [[8, 9]])[0].token_scores
               for p in (ckpt, other)]
    mix = [math.log((math.exp(a) + math.exp(b)) / 2) for a, b in zip(*singles)]
    assert score_ids(t, [[5, 6, 7]], [[8, 9]])[0].token_scores == pytest.approx(mix, abs=1e-5)


def test_scores_do_not_depend_on_the_batching(ckpt):
    lines = mixed_lines(50, seed=1)
    targets = mixed_lines(50, seed=9)
    runs = []
    for kw in ({"batch_size": 1}, {"batch_size": 7}, {"batch_size": 64}, {"max_tokens": 30},
               {"batch_size": 5, "max_tokens": 40}):
        t = Translator.from_checkpoint(ckpt, batch=BatchConfig(**kw))
        runs.append(score_pairs(t, lines, targets))
    t = Translator.from_checkpoint(ckpt)
    runs.append(score_pairs(t, lines, targets, batch=BatchConfig(batch_size=3)))
    for run in runs[1:]:
        assert [s.n_tokens for s in run] == [s.n_tokens for s in runs[0]]
        assert [s.score for s in run] == pytest.approx([s.score for s in runs[0]], abs=1e-4)


def test_empty_lines(ckpt):
    t = Translator.from_checkpoint(ckpt, batch=BatchConfig(batch_size=2))
    src = ["w1 w2", "", "  ", "w3", ""]
    tgt = ["", "w4 w5", "", "w6 w7 w8", ""]
    out = score_pairs(t, src, tgt)
    assert [s.n_tokens for s in out] == [1, 3, 1, 4, 1]
    assert all(isinstance(s, PairScore) and math.isfinite(s.score) and s.score < 0 for s in out)
    assert [len(s.token_scores) for s in out] == [1, 3, 1, 4, 1]
    # an empty target scores the eos alone: the model's first-step eos probability
    ens = t.ensemble
    src_t = torch.tensor([[t.src_codec.encode("w1 w2")[0], t.src_codec.encode("w1 w2")[1], EOS]])
    with torch.no_grad():
        probs, _ = ens.step(torch.tensor([[1]]), ens.init_state(ens.encode(src_t), group=1))
    assert out[0].log_prob == pytest.approx(math.log(float(probs[0, EOS])), abs=1e-5)
    assert out[2].score == pytest.approx(out[4].score, abs=1e-6)        # empty -> empty
    assert score_pairs(t, [], []) == []


def test_bad_input(ckpt, tmp_path, caplog):
    t = Translator.from_checkpoint(ckpt)
    with pytest.raises(NmtError, match="2 sources but 1 targets"):
        score_pairs(t, ["w1", "w2"], ["w3"])
    with pytest.raises(TypeError):
        score_pairs(t, "w1 w2", "w3")
    with pytest.raises(NmtError, match="line 2: target id outside"):
        score_ids(t, [[5], [5]], [[6], [999]])
    with pytest.raises(UsageError, match="lenpen"):
        score_ids(t, [[5]], [[6]], lenpen=-1)
    learned = Translator.from_checkpoint(
        make_checkpoint(tmp_path / "learned.pt", positional="learned", max_positions=6))
    long = " ".join(f"w{i}" for i in range(12))
    out = score_pairs(learned, [long, "w1"], ["w1", long])
    assert out[0].truncated and out[1].truncated and out[1].n_tokens == 6
    assert "line 1: source has 12" in caplog.text and "line 2: target has 12" in caplog.text


def test_own_translation_scores_higher_than_a_shuffled_one(reversal):
    t, srcs, _ = reversal
    rng = np.random.default_rng(3)
    own = [r.hypotheses[0].ids[:-1] for r in t.translate_ids(srcs)]
    pairs = [(s, o, list(rng.permutation(o))) for s, o in zip(srcs, own)]
    pairs = [(s, o, sh) for s, o, sh in pairs if sh != o]
    assert len(pairs) >= 20
    good = score_ids(t, [p[0] for p in pairs], [p[1] for p in pairs])
    bad = score_ids(t, [p[0] for p in pairs], [p[2] for p in pairs])
    assert all(g.per_token > b.per_token for g, b in zip(good, bad))


# --- alignments --------------------------------------------------------------------------------

def test_reversal_model_aligns_anti_diagonally(reversal):
    t, srcs, tgts = reversal
    al = align(t, srcs, tgts, layer=-1)
    assert [len(a) for a in al] == [len(y) for y in tgts]
    mirrored = [a[j] == len(s) - 1 - j for s, a in zip(srcs, al) for j in range(len(a))]
    assert sum(mirrored) / len(mirrored) > 0.8
    # a falsifiable test: the identity (monotone) alignment is not what it finds
    diagonal = [a[j] == j for s, a in zip(srcs, al) for j in range(len(a)) if j != len(s) - 1 - j]
    assert sum(diagonal) / len(diagonal) < 0.2
    # the same by words on text (whitespace codec: one word per token), in Pharaoh format
    lines = [t.src_codec.decode(s) for s in srcs[:5]]
    refs = [t.tgt_codec.decode(y) for y in tgts[:5]]
    assert align_lines(t, lines, refs, layer=-1) == al[:5]
    assert to_pharaoh(al[0]) == " ".join(f"{s}-{j}" for j, s in enumerate(al[0]))


def test_recomputed_weights_are_the_ones_the_layer_uses(ckpt):
    """Per-head weights x values, merged, equal what the layer's attention feeds its output
    projection (captured with a hook): the recomputation is the model's own attention."""
    from nmt.search import forced

    t = Translator.from_checkpoint(ckpt)
    model = t.ensemble.models[0]
    src, prev, _ = forced._collate([np.array([5, 6, 7, 8]), np.array([9])],
                                   [np.array([10, 11]), np.array([12, 13, 14])], [0, 1], "cpu")
    attn = model.decoder_layers[0].cross_attn
    seen = []
    hook = attn.out_proj.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    with torch.no_grad():
        heads = forced._cross_attention_heads(model, 0, src, prev)       # [B, H, T, S]
        hook.remove()
        enc = model.encode(src)
        _, v = attn.project_kv(enc.out)
    b, h, tt, _ = heads.shape
    merged = torch.matmul(heads, v).transpose(1, 2).reshape(b, tt, h * attn.d_v)
    assert torch.allclose(merged, seen[0], atol=1e-5)
    assert float(heads[1, :, :, 2:].abs().max()) == 0.0                # padding gets nothing
    assert not attn.q_proj._forward_hooks and not attn.out_proj._forward_pre_hooks


def test_attention_weights_layers_and_edge_cases(ckpt):
    t = Translator.from_checkpoint(ckpt, batch=BatchConfig(batch_size=2))
    before = t.translate(mixed_lines(8))
    src = [[5, 6, 7], [], [8, 9], [10]]
    tgt = [[11, 12], [13, 14], [], [15, 16, 17]]
    w = attention_weights(t, src, tgt)
    assert [x.shape for x in w] == [(3, 4), (3, 1), (1, 3), (4, 2)]
    assert all(np.allclose(x.sum(axis=1), 1.0, atol=1e-5) for x in w)
    al = align(t, src, tgt)
    assert [len(a) for a in al] == [2, 2, 0, 3] and al[1] == [-1, -1]
    assert all(0 <= j < len(s) for s, a in zip(src, al) if s for j in a)
    # the default is the penultimate layer (of 2: layer 0), and batching changes nothing
    assert al == align(t, src, tgt, layer=0) == align(t, src, tgt, layer=-2)
    one = attention_weights(t, src, tgt, layer=1, batch=BatchConfig(batch_size=1))
    many = attention_weights(t, src, tgt, layer=1, batch=BatchConfig(batch_size=64))
    assert all(np.allclose(a, b, atol=1e-5) for a, b in zip(one, many))
    with pytest.raises(UsageError, match="decoder layer 2 does not exist"):
        align(t, src, tgt, layer=2)
    assert t.translate(mixed_lines(8)) == before          # nothing left behind on the model


# --- words ---------------------------------------------------------------------------------------

def test_word_indices_of_the_three_subword_kinds():
    sp = ["\u2581The", "\u2581un", "believ", "able", "\u2581dog", "."]
    assert word_indices(sp) == word_indices(sp, "bpe") == [0, 1, 1, 1, 2, 2]
    wp = ["The", "un", "##believ", "##able", "dog", "##."]
    assert word_indices(wp) == word_indices(wp, "wordpiece") == [0, 1, 1, 1, 2, 2]
    ws = ["(S", "XX", ")S", "##x"]
    assert word_indices(ws, "none") == [0, 1, 2, 3]
    assert word_indices([]) == []
    assert word_indices(["a\u2581", "b"], "bpe") == [0, 0]      # first piece starts word 0


def test_words_alignment():
    src = ["\u2581Das", "\u2581Haus", "chen", "\u2581ist", "\u2581klein"]      # 4 words
    tgt = ["\u2581The", "\u2581little", "\u2581house", "\u2581is", "\u2581sm", "all"]
    sub = [0, 4, 2, 3, 4, 1]
    # 'small' = sm (-> klein, word 3) + all (-> Haus, word 1): a tie, its first subword wins
    assert words_alignment(src, tgt, sub) == [0, 3, 1, 2, 3]
    # majority: three subwords, two to word 1
    tgt2 = ["house", "##hold", "##s"]
    assert words_alignment(src, tgt2, [4, 1, 2], tgt_kind="wordpiece") == [1]
    assert words_alignment([], ["a", "b"], [-1, -1], src_kind="none") == [-1, -1]
    assert words_alignment(src, [], []) == []
    with pytest.raises(ValueError, match="2 alignment links for 3"):
        words_alignment(src, tgt2, [0, 1])
    with pytest.raises(ValueError, match="outside"):
        words_alignment(src, tgt2, [0, 1, 5])
    assert to_pharaoh([2, -1, 0]) == "2-0 0-2"
