"""Greedy decoding (nmt.search.greedy) gives what beam search with beam 1 gives, bit for bit:
the same tokens, token log-probabilities and scores, with float32 and bf16 weights, ensembles,
the length limit forcing eos, and rows that finish at different steps."""

import pytest
import torch

import nmt.search.greedy as greedy
from nmt.search.beam import beam_candidates, split_candidates
from nmt.search.config import BatchConfig, SearchConfig
from nmt.search.translator import Translator

from test_translator import BF16, make_checkpoint, mixed_lines


def results(paths, monkeypatch, use_greedy, precision, **search):
    monkeypatch.setattr(greedy, "applies",
                        (lambda cfg, c=None: APPLIES(cfg, c)) if use_greedy else
                        (lambda cfg, c=None: False))
    t = Translator.from_checkpoint(paths, search=SearchConfig(beam=1, **search),
                                   batch=BatchConfig(batch_size=16), precision=precision)
    return [[(h.ids, h.token_scores, h.score) for h in r.hypotheses]
            for r in t.translate_results(LINES)]


APPLIES = greedy.applies
LINES = mixed_lines(120, seed=11)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    d = tmp_path_factory.mktemp("greedy")
    return [str(make_checkpoint(d / f"m{s}.pt", seed=s)) for s in (0, 1, 2)]


@pytest.mark.parametrize("precision", ["fp32", BF16])
@pytest.mark.parametrize("search", [{}, {"max_len_a": 0.0, "max_len_b": 3},
                                    {"lenpen": 1.0, "lenpen_formula": "fairseq"}])
def test_greedy_equals_beam_one(ckpts, monkeypatch, precision, search):
    for paths in ([ckpts[0]], [ckpts[1]], ckpts[1:]):
        want = results(paths, monkeypatch, False, precision, **search)
        got = results(paths, monkeypatch, True, precision, **search)
        assert got == want
        assert sum(len(h) for h in got) > 0


def test_it_is_the_path_taken(ckpts, monkeypatch):
    called = []
    real = greedy.greedy_search
    monkeypatch.setattr(greedy, "greedy_search", lambda *a: called.append(1) or real(*a))
    t = Translator.from_checkpoint(ckpts[0], search=SearchConfig(beam=1))
    t.translate(LINES[:5])
    assert called
    called.clear()
    Translator.from_checkpoint(ckpts[0], search=SearchConfig(beam=2)).translate(LINES[:5])
    Translator.from_checkpoint(ckpts[0], search=SearchConfig(beam=1, min_len=2)).translate(
        LINES[:5])
    Translator.from_checkpoint(ckpts[0], search=SearchConfig(
        beam=1, lenpen_formula="hf")).translate(LINES[:5])
    assert not called


def test_a_near_tie_goes_to_the_more_probable_token():
    """Two probabilities 1 ulp apart whose float32 sums with the prefix score are equal: beam
    search ranks them as tied and takes the smaller id; greedy takes the more probable token
    (the one difference from beam 1, stated in nmt.search.greedy)."""
    p_big = torch.tensor(0.3, dtype=torch.float32)
    p_small = torch.nextafter(p_big, torch.tensor(0.0))
    score = torch.tensor([[-40.0]])
    assert score + p_big.log() == score + p_small.log()   # the sums tie
    probs = torch.zeros(1, 8)
    probs[0, 6], probs[0, 5] = p_big, p_small
    best, lp = greedy._choose(probs.clone(), None)
    assert best.item() == 6 and lp.item() == p_big.log().item()
    assert beam_choice(probs, score) == 5
    probs[0, 5] = p_big                                    # an exact tie: the smaller id
    best, _ = greedy._choose(probs.clone(), None)
    assert best.item() == 5 == beam_choice(probs, score)


def test_one_model_chooses_by_its_logits():
    """One model's greedy step picks the largest logit (smallest id among equal ones, never
    pad or bos, only eos at the length limit) and scores it with the log of its float32
    softmax probability; without scores it computes no probability at all."""
    logits = torch.tensor([[9.0, 8.0, 1.0, 3.0, 5.0, 5.0],       # pad and bos larger
                           [0.0, 0.0, 1.0, 3.0, 2.0, 3.0],       # a tie: the smaller id
                           [0.0, 0.0, -50.0, 3.0, 2.0, 1.0]])    # at the limit: eos
    at_max = torch.tensor([False, False, True])
    best, lp = greedy._choose_by_logits(logits.clone(), at_max, scores=True)
    assert best.tolist() == [4, 3, 2]
    probs = torch.softmax(logits, dim=-1)
    want = probs[torch.arange(3), best].clamp(min=1e-30).log()
    assert torch.equal(lp, want)
    best2, none = greedy._choose_by_logits(logits.clone(), at_max, scores=False)
    assert torch.equal(best2, best) and none is None


def test_without_scores_the_tokens_are_the_same(ckpts, monkeypatch):
    """Text output asks for no scores: the same translations, scores None."""
    t = Translator.from_checkpoint(ckpts[0], search=SearchConfig(beam=1),
                                   batch=BatchConfig(batch_size=16))
    seen = []
    real = greedy._choose_by_logits
    monkeypatch.setattr(greedy, "_choose_by_logits",
                        lambda *a: seen.append(a[2]) or real(*a))
    scored = t.translate_results(LINES)
    plain = t.translate_results(LINES, scores=False)
    assert seen and set(seen) == {True, False}
    assert [r.text for r in plain] == [r.text for r in scored] == t.translate(LINES)
    assert [h.ids for r in plain for h in r.hypotheses] == \
        [h.ids for r in scored for h in r.hypotheses]
    assert all(h.score is None and h.token_scores is None
               for r in plain for h in r.hypotheses)
    assert all(h.score is not None for r in scored for h in r.hypotheses)


def beam_choice(probs, score):
    cand_scores, _, cand_tokens, _ = beam_candidates(probs.view(1, 1, -1), score, 2)
    _, pos, _ = split_candidates(cand_scores, cand_tokens, 2, 1)
    return cand_tokens.gather(1, pos).item()
