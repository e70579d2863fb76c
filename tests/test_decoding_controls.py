"""Decoding controls as fairseq users know them: --min-len, --no-repeat-ngram-size, --unkpen,
--replace-unk and diverse beam search, on the Translator, nmt-generate and (test_serve) the
server. Each test first shows that the output without the control breaks its rule, so that
it can fail."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import nmt
from nmt.batch.config import GenerateConfig
from nmt.data.codec import whitespace_codec
from nmt.data.dictionary import Dictionary
from nmt.errors import UsageError
from nmt.search.controls import ban_repeats
from nmt.search.ensemble import EnsembleModel
from nmt.search.forced import score_ids
from nmt.search.generator import beam_search
from nmt.search.translator import SearchConfig, Translator

from test_search import TREE, ScriptedModel, table_dist
from test_train_cli import run
from test_translator import make_checkpoint, mixed_lines

EOS, UNK, A, B = 2, 3, 4, 5


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("controls") / "tiny.pt", max_len_b=10)


def hyps(ckpt, lines, **search):
    t = Translator.from_checkpoint(ckpt, search=SearchConfig(**search))
    return t, t.translate_results(lines)


def ngrams(ids, n):
    return [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]


def test_min_len(ckpt):
    lines = [x for x in mixed_lines(60, seed=3) if x.strip()]
    _, plain = hyps(ckpt, lines)
    short = [len(r.hypotheses[0].ids) - 1 for r in plain]
    assert min(short) < 6                                   # without it, shorter outputs
    _, out = hyps(ckpt, lines, min_len=6, nbest=2)
    for r in out:
        for h in r.hypotheses:
            assert len(h.ids) - 1 >= 6 and h.ids[-1] == EOS
    # the length limit wins over --min-len: at max_len the eos comes all the same
    _, capped = hyps(ckpt, lines[:5], min_len=50, max_len_a=0.0, max_len_b=4)
    assert all(len(r.hypotheses[0].ids) - 1 == 4 for r in capped)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram(ckpt, n):
    lines = [x for x in mixed_lines(60, seed=4) if x.strip()]
    _, plain = hyps(ckpt, lines, max_len_a=2.0)
    def repeats(h):
        g = ngrams(h.ids[:-1], n)
        return len(g) != len(set(g))
    assert any(repeats(r.hypotheses[0]) for r in plain)      # it can fail
    _, out = hyps(ckpt, lines, max_len_a=2.0, no_repeat_ngram_size=n, nbest=3)
    assert not any(repeats(h) for r in out for h in r.hypotheses)


def test_ban_repeats_on_a_hand_made_history():
    hist = torch.tensor([[A, B, A, 6, A], [A, B, 6, 7, 6]])
    p = torch.ones(2, 8)
    ban_repeats(p, hist, 2)
    # row 0 ends in A: A was followed by B and 6 -> both banned; row 1 ends in 6: followed by 7
    assert p[0].tolist() == [1, 1, 1, 1, 1, 0, 0, 1]
    assert p[1].tolist() == [1, 1, 1, 1, 1, 1, 1, 0]
    p = torch.ones(2, 8)
    ban_repeats(p, hist, 3)           # row 0: (6, A) never seen before -> nothing banned
    assert p[0].tolist() == [1] * 8 and p[1].tolist() == [1] * 8
    p = torch.ones(1, 8)
    ban_repeats(p, hist[:1, :1], 2)   # shorter than an n-gram: nothing to ban
    assert p.tolist() == [[1] * 8]


def test_unkpen_on_a_scripted_model():
    """<unk> 0.6 vs A 0.4: beam search takes <unk>; --unkpen 1 makes it 0.6/e = 0.22 < 0.4.
    As in fairseq, the penalty is part of the score."""
    tree = {12: {(): {UNK: .6, A: .4}, (UNK,): {EOS: 1.0}, (A,): {EOS: 1.0}}}
    src = torch.tensor([[12, EOS]])
    model = EnsembleModel([ScriptedModel(table_dist(tree))])
    plain = beam_search(model, src, SearchConfig(beam=2, lenpen=0.0, max_len_a=0.0,
                                                 max_len_b=5))[0][0]
    assert plain.tokens == [UNK, EOS]
    pen = beam_search(model, src, SearchConfig(beam=2, lenpen=0.0, max_len_a=0.0, max_len_b=5,
                                               unkpen=1.0, nbest=2))[0]
    assert [h.tokens for h in pen] == [[A, EOS], [UNK, EOS]]
    assert pen[1].score == pytest.approx(math.log(.6) - 1.0, abs=1e-6)


def test_diverse_beam_search(ckpt):
    lines = [x for x in mixed_lines(40, seed=5) if x.strip()]
    t, plain = hyps(ckpt, lines, beam=4, nbest=4)
    t, out = hyps(ckpt, lines, beam=4, nbest=4, diverse_beam_groups=4,
                  diverse_beam_strength=100.0)
    def firsts(results):            # distinct first words in a sentence's 4-best, on average
        return np.mean([len({h.ids[0] for h in r.hypotheses}) for r in results])
    # The plain 4-best lists share their first words (1.7 distinct of 4 on average); the
    # four groups start with four different words, though a group may finish twice and
    # place two hypotheses in the 4-best (3.6 distinct).
    assert firsts(plain) < 2.0 and firsts(out) > 3.4
    # the penalty steers the choice only: scores are the model's log-probabilities
    for r in out[:5]:
        forced = score_ids(t, [t.src_codec.encode(r.source)] * 4,
                           [h.ids[:-1] for h in r.hypotheses])
        for h, f in zip(r.hypotheses, forced):
            assert h.score == pytest.approx(f.score, abs=1e-4)
    # one group is plain beam search
    _, one = hyps(ckpt, lines, beam=4, nbest=4, diverse_beam_groups=1)
    assert [[h.ids for h in r.hypotheses] for r in one] == \
        [[h.ids for h in r.hypotheses] for r in plain]
    # strength 0: the groups are independent beams of 2 (not the beam of 4): both find what
    # beam search of 2 finds, so each of its two best comes twice, in its order
    _, zero = hyps(ckpt, lines, beam=4, nbest=4, diverse_beam_groups=2,
                   diverse_beam_strength=0.0)
    _, two = hyps(ckpt, lines, beam=2, nbest=2)
    for z, t in zip(zero, two):
        best = [h.ids for h in t.hypotheses]
        assert [h.ids for h in z.hypotheses] == [best[0], best[0], best[1], best[1]]


def test_diverse_groups_choose_distinct_tokens():
    """With a prohibitive strength, the live rows that the groups keep at a step hold
    different tokens (one per group here: groups of one), whatever the probabilities."""
    from nmt.search.beam import diverse_candidates

    g = torch.Generator().manual_seed(0)
    probs = torch.rand(5, 4, 12, generator=g) ** 4
    probs[:, :, EOS] = 0.0
    probs /= probs.sum(-1, keepdim=True)
    scores = torch.log(torch.rand(5, 4, generator=g))
    c_scores, c_beams, c_tokens, c_lprobs, fin, pos, alive = diverse_candidates(
        probs, scores, 4, 1e4, EOS)
    kept = c_tokens.gather(1, pos)                                   # [5, 4]
    assert bool(alive.all()) and all(len(set(row)) == 4 for row in kept.tolist())
    # and the scores are the model's: previous score + log-prob of the token
    beams = c_beams.gather(1, pos)
    want = scores.gather(1, beams) + probs.log()[torch.arange(5).unsqueeze(1), beams, kept]
    assert torch.allclose(c_scores.gather(1, pos), want, atol=1e-5)
    # without diversity the best rows pile onto the same tokens
    _, _, c_tokens, _, _, pos, _ = diverse_candidates(probs, scores, 4, 0.0, EOS)
    assert any(len(set(row)) < 4 for row in c_tokens.gather(1, pos).tolist())


def test_diverse_on_the_scripted_tree():
    """Key 11: plain beam 2 keeps A (.55) and B (.45) at the first step anyway; with 2 groups
    of 1 and a strong penalty, group 1 may not take group 0's A, so it takes B: the best
    hypotheses are those of greedy (A C ...) and of B."""
    src = torch.tensor([[11, EOS]])
    model = EnsembleModel([ScriptedModel(table_dist(TREE))])
    out = beam_search(model, src, SearchConfig(beam=2, lenpen=0.0, max_len_a=0.0, max_len_b=3,
                                               nbest=2, diverse_beam_groups=2,
                                               diverse_beam_strength=5.0))[0]
    assert {h.tokens[0] for h in out} == {A, B}


def test_bad_control_values():
    with pytest.raises(UsageError, match="min-len must be >= 0"):
        SearchConfig(min_len=-1)
    with pytest.raises(UsageError, match="no-repeat-ngram-size must be >= 0"):
        SearchConfig(no_repeat_ngram_size=-2)
    with pytest.raises(UsageError, match="must divide the beam size 4"):
        SearchConfig(beam=4, diverse_beam_groups=3)
    with pytest.raises(UsageError, match="diverse-beam-strength must be >= 0"):
        SearchConfig(diverse_beam_strength=-1.0)
    with pytest.raises(UsageError, match="does not go with --sampling"):
        GenerateConfig(sampling=True, diverse_beam_groups=2)
    with pytest.raises(UsageError, match="--align-layer goes with"):
        GenerateConfig(align_layer=1)
    # the preset's beam (4) is checked when the config is resolved
    with pytest.raises(UsageError, match="must divide the beam size 4"):
        SearchConfig(diverse_beam_groups=3).resolve()


def test_sampling_searches_nbest_rows_whatever_the_beam():
    # (samples do not use the beam: batches are sized by the rows a sentence really takes)
    for beam in (None, 1, 8):
        assert GenerateConfig(sampling=True, beam=beam, nbest=2).search.beam == 2
    assert GenerateConfig(beam=8, nbest=2).search.beam == 8


# --- --replace-unk: a model trained to reverse sequences, some words unknown to it ----------

KNOWN = [f"w{i}" for i in range(16)]


def reversal_with_unknowns(steps=300):
    """A tiny Transformer trained to reverse sequences in which a quarter of the words are
    out of vocabulary (<unk> on both sides): it learns to put <unk> where the source has one.
    Its last decoder layer aligns (test_forced.test_reversal_model_aligns_anti_diagonally)."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    codec = whitespace_codec(Dictionary(KNOWN))
    vocab = len(codec.dictionary)
    model = nmt.build_model(nmt.get_arch("transformer_tiny", {"dropout": 0.0}), vocab, vocab)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98))
    model.train()
    for _ in range(steps):
        srcs = [rng.integers(4, vocab + 5, int(rng.integers(2, 9))) for _ in range(32)]
        srcs = [np.where(s >= vocab, UNK, s) for s in srcs]
        width = max(s.size for s in srcs) + 1
        src, prev, gold = (torch.zeros(len(srcs), width, dtype=torch.long) for _ in range(3))
        for r, s in enumerate(srcs):
            n, rev = s.size, torch.from_numpy(s[::-1].copy())
            src[r, :n], src[r, n] = torch.from_numpy(s), EOS
            prev[r, 0], prev[r, 1:n + 1] = 1, rev
            gold[r, :n], gold[r, n] = rev, EOS
        loss = torch.nn.functional.cross_entropy(model(src, prev).reshape(-1, vocab),
                                                 gold.reshape(-1), ignore_index=0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), codec


@pytest.fixture(scope="module")
def unk_model(tmp_path_factory):
    from nmt import checkpoint as ckpt_io
    from nmt.checkpoint import save_checkpoint

    model, codec = reversal_with_unknowns()
    path = tmp_path_factory.mktemp("unk") / "reverse.pt"
    save_checkpoint(ckpt_io.make_checkpoint(
        model_config=model.cfg, model_state=model.state_dict(), share_all_embeddings=True,
        src_codec=codec, tgt_codec=codec, src_lang="xx", tgt_lang="yy"), path)
    return path


def test_replace_unk_copies_the_aligned_source_word(unk_model, tmp_path):
    lines = ["w4 Zürich w5 w6", "w7 w8 42 w9 w10 Köln", "w11 w12 w13", "Paris"]
    expected = ["w6 w5 Zürich w4", "Köln w10 w9 42 w8 w7", "w13 w12 w11", "Paris"]
    t = Translator.from_checkpoint(unk_model, search=SearchConfig(beam=4))
    plain = t.translate(lines)
    assert plain[0].split()[2] != "Zürich" and "<unk>" in plain[0]    # it can fail
    t = Translator.from_checkpoint(unk_model, search=SearchConfig(beam=4, replace_unk=True))
    t.align_layer = -1
    assert t.translate(lines) == expected
    # a line without <unk> keeps its text byte for byte
    assert t.translate(["w11 w12 w13"]) == [plain[2]]
    # the command line: --replace-unk with --align-layer, text and jsonl output
    src = tmp_path / "in.txt"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    r = run(["nmt-generate", str(unk_model), "-i", str(src), "--replace-unk", "--align-layer",
             "-1", "--threads", "1", "-q"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == expected
    r = run(["nmt-generate", str(unk_model), "-i", str(src), "--replace-unk", "--align-layer",
             "-1", "--threads", "1", "-q", "--output-format", "jsonl", "--print-alignment"])
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["translation"] for x in rows] == expected
    assert rows[0]["tokens"][2] == "<unk>"                   # the tokens are the model's


def test_generate_options_reach_the_search(ckpt, tmp_path):
    src = tmp_path / "in.txt"
    lines = [x for x in mixed_lines(30, seed=6) if x.strip()]
    src.write_text("\n".join(lines) + "\n")
    base = ["nmt-generate", str(ckpt), "-i", str(src), "--threads", "1", "-q"]
    r = run(base + ["--min-len", "7", "--no-repeat-ngram-size", "2", "--output-format",
                    "jsonl"])
    assert r.returncode == 0, r.stderr
    t, want = hyps(ckpt, lines, min_len=7, no_repeat_ngram_size=2)
    got = [json.loads(x)["tokens"] for x in r.stdout.splitlines()]
    assert got == [h.tokens for h in (x.hypotheses[0] for x in want)]
    assert all(len(toks) - 1 >= 7 for toks in got)
    r = run(base + ["--diverse-beam-groups", "3"])
    assert r.returncode == 2 and "must divide the beam size 4" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
