"""Beam search pinned with scripted models (fixed next-token probabilities) and the real model.

A scripted model implements the same encode / init_state / decode / reorder / select_sentences
interface as nmt.models.Transformer; its next-token distribution is a fixed function of
(source key, generated prefix), so every score can be computed by hand.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import nmt
from nmt.errors import UsageError
from nmt.search.beam import split_candidates, topk_stable
from nmt.search.ensemble import EnsembleModel
from nmt.search.generator import SearchConfig, beam_search
from nmt.search.length_penalty import best_possible_score, length_penalty

PAD, BOS, EOS, UNK = 0, 1, 2, 3
A, B, C, D = 4, 5, 6, 7
V = 8


class ScriptedState:
    def __init__(self, keys, prefixes, group):
        self.keys, self.prefixes, self.group = keys, prefixes, group

    def reorder(self, index):
        idx = index.tolist()
        assert len(idx) == len(self.prefixes)
        # The contract: a row may only be replaced by a row of the same sentence.
        assert all(i // self.group == r // self.group for r, i in enumerate(idx))
        return ScriptedState(self.keys, [self.prefixes[i] for i in idx], self.group)

    def select_sentences(self, keep):
        keep = keep.tolist()
        g = self.group
        return ScriptedState([self.keys[b] for b in keep],
                             [self.prefixes[b * g + j] for b in keep for j in range(g)], g)

    def expand(self, group):
        assert self.group == 1
        return ScriptedState(self.keys, [p for p in self.prefixes for _ in range(group)], group)


class ScriptedModel:
    """Next-token probabilities = dist(key, prefix), key = the first source token."""

    max_positions = None

    def __init__(self, dist):
        self.dist = dist
        self.calls = 0

    def encode(self, src):
        return src[:, 0].tolist()

    def init_state(self, keys, group=1):
        return ScriptedState(keys, [() for _ in range(len(keys) * group)], group)

    def decode(self, prev, state):
        assert prev.shape == (len(state.prefixes), 1)
        self.calls += 1
        prefixes = [p if t == BOS else p + (t,) for p, t in zip(state.prefixes,
                                                                 prev[:, 0].tolist())]
        probs = np.stack([self.dist(state.keys[r // state.group], p)
                          for r, p in enumerate(prefixes)])
        with np.errstate(divide="ignore"):
            logits = torch.tensor(np.log(probs), dtype=torch.float32)
        return logits.unsqueeze(1), ScriptedState(state.keys, prefixes, state.group)


def table_dist(tables):
    """dist from {key: {prefix: {token: prob}}}; unlisted prefixes: eos .5, unk .5."""
    def dist(key, prefix):
        p = np.zeros(V)
        for tok, pr in tables[key].get(prefix, {EOS: 0.5, UNK: 0.5}).items():
            p[tok] = pr
        return p
    return dist


# Key 10: the length penalty decides. "A </s>" has P = .6 * .5 = .3 (|Y| = 2);
# "B C D </s>" has P = .4 * .9 * .9 * .9 = .2916 (|Y| = 4).
TREE = {
    10: {(): {A: .6, B: .4}, (A,): {EOS: .5, C: .5}, (B,): {C: .9, D: .1},
         (B, C): {D: .9, EOS: .1}, (B, C, D): {EOS: .9, C: .1}, (A, C): {D: .9, EOS: .1}},
    # Key 11: greedy takes A then C; beam 2 finds "B </s>" (.45 * .9 = .405).
    11: {(): {A: .55, B: .45}, (A,): {C: .4, D: .3, EOS: .3}, (B,): {EOS: .9, C: .1}},
}


def run(dist, keys, **kw):
    kw.setdefault("max_len_a", 0.0)
    kw.setdefault("max_len_b", 10)
    src = torch.tensor([[k, EOS] for k in keys])
    return beam_search(EnsembleModel([ScriptedModel(dist)]), src, SearchConfig(**kw).resolve())


def test_length_penalty_values():
    assert length_penalty(1, 0.6) == pytest.approx(1.0)
    assert length_penalty(7, 0.6) == pytest.approx(2.0 ** 0.6)
    assert length_penalty(30, 0.0) == 1.0
    t = length_penalty(torch.tensor([1, 7]), 1.0)
    assert t.tolist() == pytest.approx([1.0, 2.0])
    # the bound is never below what any longer continuation can reach
    s, lmax = torch.tensor([-2.0]), torch.tensor([20])
    bound = float(best_possible_score(s, lmax, 0.6))
    for length in range(3, 21):
        for extra in (0.0, 0.1, 3.0):
            assert (-2.0 - extra) / length_penalty(length, 0.6) <= bound + 1e-9


def test_lenpen_changes_the_winner():
    dist = table_dist(TREE)
    short = run(dist, [10], beam=2, lenpen=0.0)[0][0]
    assert short.tokens == [A, EOS]
    assert short.score == pytest.approx(math.log(.6 * .5), abs=1e-5)
    assert short.token_scores == pytest.approx([math.log(.6), math.log(.5)], abs=1e-5)

    long = run(dist, [10], beam=2, lenpen=0.6)[0][0]
    assert long.tokens == [B, C, D, EOS]
    assert long.score == pytest.approx(math.log(.4 * .9 ** 3) / 1.5 ** 0.6, abs=1e-5)
    assert long.token_scores == pytest.approx([math.log(x) for x in (.4, .9, .9, .9)], abs=1e-5)
    assert long.log_prob == pytest.approx(math.log(.4 * .9 ** 3), abs=1e-5)


def test_nbest_order_and_scores():
    hyps = run(table_dist(TREE), [10], beam=2, lenpen=1.0, nbest=2)[0]
    assert [h.tokens for h in hyps] == [[B, C, D, EOS], [A, EOS]]
    assert [h.score for h in hyps] == pytest.approx(
        [math.log(.2916) / 1.5, math.log(.3) / (7 / 6)], abs=1e-5)


def test_beam_beats_greedy_and_batches_sentences():
    dist = table_dist(TREE)
    res = run(dist, [11, 10, 11], beam=2, lenpen=0.0)
    assert [r[0].tokens for r in res] == [[B, EOS], [A, EOS], [B, EOS]]
    greedy = run(dist, [11], beam=1, lenpen=0.0)[0][0]
    # A (.55), C (.4), then the default table: eos and unk tie at .5 -> eos (smaller id)
    assert greedy.tokens == [A, C, EOS]
    assert greedy.score == pytest.approx(math.log(.55 * .4 * .5), abs=1e-5)


def test_forced_eos_at_max_length_and_empty_budget():
    always_a = lambda key, prefix: np.eye(V)[A] * 0.9 + np.eye(V)[B] * 0.1  # noqa: E731
    hyp = run(always_a, [10], beam=3, max_len_a=1.0, max_len_b=3)[0][0]
    # source length 1 (the key) -> at most 1*1 + 3 = 4 tokens, then a forced eos
    assert hyp.tokens == [A, A, A, A, EOS]
    hyp = run(always_a, [10], beam=2, max_len_a=0.0, max_len_b=0)[0][0]
    assert hyp.tokens == [EOS]


def test_bad_search_options():
    with pytest.raises(UsageError):
        SearchConfig(beam=0)
    with pytest.raises(UsageError):
        SearchConfig(beam=2, nbest=3)
    with pytest.raises(UsageError):
        SearchConfig(lenpen=-1)


def test_topk_stable_breaks_ties_by_index():
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 0.0],
                      [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    v, i = topk_stable(x, 2)
    assert i.tolist() == [[1, 2], [1, 2]]
    v, i = topk_stable(x, 4)
    assert i.tolist() == [[1, 2, 4, 3], [1, 2, 3, 4]]
    v, i = topk_stable(torch.tensor([[5.0, 5.0]]), 4)      # k larger than the row
    assert i.tolist() == [[0, 1]]


def test_topk_stable_equals_a_full_stable_sort():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 6, (200, 37), generator=g).float()     # many ties everywhere
    x[:20, 5:] = float("-inf")
    for k in (1, 2, 5, 8, 36, 37, 40):
        v, i = topk_stable(x, k)
        sv, si = x.sort(dim=1, descending=True, stable=True)
        finite = torch.isfinite(sv[:, :k])
        assert torch.equal(v, sv[:, :k])
        assert torch.equal(i[finite], si[:, :k][finite])


def test_split_candidates():
    inf = float("-inf")
    scores = torch.tensor([[-1.0, -2.0, -3.0, -4.0], [-1.0, inf, inf, inf]])
    tokens = torch.tensor([[EOS, 5, EOS, 6], [EOS, 5, 6, 7]])
    fin, pos, alive = split_candidates(scores, tokens, EOS, 2)
    assert fin.tolist() == [[True, False], [True, False]]
    assert pos[0].tolist() == [1, 3]                 # the eos at position 2 is dropped
    assert alive.tolist() == [[True, True], [False, False]]


# --- against a plain reference implementation -------------------------------------------------

def random_dist(key, prefix):
    rng = np.random.default_rng(abs(hash((key, prefix))) % (2 ** 32))
    p = rng.dirichlet(np.full(V, 0.4))
    p[PAD] = p[BOS] = 0.0
    p[EOS] += 0.08 * len(prefix)            # longer prefixes end more often
    return p / p.sum()


def reference_beam(dist, key, beam, alpha, max_len, nbest):
    """Textbook beam search with fairseq's policy, one sentence, no early-termination bound."""
    live = [((), 0.0)]
    finished = []
    for step in range(max_len + 1):
        cands = []
        for b, (prefix, score) in enumerate(live):
            p = dist(key, prefix)
            for tok in range(V):
                if p[tok] > 0 and (step < max_len or tok == EOS):
                    cands.append((score + math.log(p[tok]), b * V + tok, b, tok))
        cands.sort(key=lambda c: (-c[0], c[1]))
        cands = cands[:2 * beam]
        for j, (s, _, b, tok) in enumerate(cands):
            if tok == EOS and j < beam:
                finished.append((s / ((5 + step + 1) / 6) ** alpha, live[b][0] + (EOS,)))
        live = [(live[b][0] + (tok,), s) for s, _, b, tok in cands if tok != EOS][:beam]
        if len(finished) >= beam or not live:
            break
    finished.sort(key=lambda f: -f[0])
    return finished[:nbest]


@pytest.mark.parametrize("beam,alpha,nbest", [(1, 0.6, 1), (2, 0.0, 1), (3, 0.6, 2),
                                              (4, 1.0, 3), (5, 0.6, 1)])
def test_matches_reference_beam_search(beam, alpha, nbest):
    keys = list(range(20, 32))
    src_len = [1 + k % 4 for k in keys]
    src = torch.full((len(keys), 5), PAD)
    for r, (k, n) in enumerate(zip(keys, src_len)):
        src[r, :n] = k
        src[r, n] = EOS
    cfg = SearchConfig(beam=beam, lenpen=alpha, max_len_a=1.0, max_len_b=4, nbest=nbest)
    got = beam_search(EnsembleModel([ScriptedModel(random_dist)]), src, cfg)
    for k, n, hyps in zip(keys, src_len, got):
        want = reference_beam(random_dist, k, beam, alpha, n + 4, nbest)
        assert [h.tokens for h in hyps] == [list(w[1]) for w in want]
        assert [h.score for h in hyps] == pytest.approx([w[0] for w in want], abs=1e-4)


def test_finished_sentences_leave_the_batch():
    """Rows of short sentences are dropped: later steps run on fewer rows."""
    seen = []

    class Counting(ScriptedModel):
        def decode(self, prev, state):
            seen.append(prev.size(0))
            return super().decode(prev, state)

    src = torch.tensor([[11, EOS], [10, EOS]])
    beam_search(EnsembleModel([Counting(table_dist(TREE))]), src,
                SearchConfig(beam=2, lenpen=0.0, max_len_a=0.0, max_len_b=10))
    # the first step decodes one row per sentence, then each sentence has its 2 beams
    assert seen[:2] == [2, 4] and seen[-1] == 2


# --- the real model -----------------------------------------------------------------------------

def tiny_model(vocab=40, seed=0, **overrides):
    torch.manual_seed(seed)
    cfg = nmt.get_arch("transformer_tiny", {"dropout": 0.0, **overrides})
    model = nmt.build_model(cfg, vocab, vocab).eval()
    with torch.no_grad():               # make eos likely enough that lengths vary
        model.tgt_embed.weight[EOS] *= 4.0
    return model


def random_src(n, vocab=40, seed=1, max_len=9):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, max_len + 1, (n,), generator=g)
    src = torch.full((n, int(lens.max()) + 1), PAD)
    for r, n_r in enumerate(lens.tolist()):
        src[r, :n_r] = torch.randint(4, vocab, (n_r,), generator=g)
        src[r, n_r] = EOS
    return src


def greedy_reference(model, src, max_len_a, max_len_b):
    """Plain greedy decoding, recomputing the full decoder over the prefix at every step."""
    out = []
    for r in range(src.size(0)):
        s = src[r:r + 1, : int(src[r].ne(PAD).sum())]
        max_len = int(math.floor(max_len_a * (s.size(1) - 1) + max_len_b))
        enc = model.encode(s)
        prefix = [BOS]
        while True:
            logits = model.decode_full(torch.tensor([prefix]), enc)[0, -1]
            lp = torch.log_softmax(logits.float(), -1)
            lp[PAD] = lp[BOS] = float("-inf")
            tok = EOS if len(prefix) - 1 == max_len else int(lp.argmax())
            prefix.append(tok)
            if tok == EOS:
                break
        out.append(prefix[1:])
    return out


@torch.inference_mode()
def test_beam1_equals_plain_greedy_loop():
    model = tiny_model()
    src = random_src(12)
    got = beam_search(EnsembleModel([model]), src,
                      SearchConfig(beam=1, lenpen=0.6, max_len_a=1.0, max_len_b=6))
    want = greedy_reference(model, src, 1.0, 6)
    assert [h[0].tokens for h in got] == want
    assert len({len(w) for w in want}) > 2          # lengths vary: early and forced endings


class UncachedState:
    def __init__(self, enc, prefix, group):
        self.enc, self.prefix, self.group = enc, prefix, group

    def reorder(self, index):
        return UncachedState(self.enc, self.prefix.index_select(0, index), self.group)

    def select_sentences(self, keep):
        g = self.group
        rows = (keep.unsqueeze(1) * g + torch.arange(g)).reshape(-1)
        return UncachedState(self.enc.select(keep), self.prefix.index_select(0, rows), g)

    def expand(self, group):
        assert self.group == 1
        return UncachedState(self.enc, self.prefix.repeat_interleave(group, 0), group)


class Wrapped:
    """The real model behind the search's model interface; subclasses change one part."""

    def __init__(self, model):
        self.model = model
        self.max_positions = model.max_positions

    def encode(self, src):
        return self.model.encode(src)


class Uncached(Wrapped):
    """The real model without its KV cache: every step reruns the decoder on the whole prefix."""

    def init_state(self, enc, group=1):
        return UncachedState(enc, torch.zeros(enc.out.size(0) * group, 0, dtype=torch.long),
                             group)

    def decode(self, prev, state):
        prefix = torch.cat([state.prefix, prev], dim=1)
        rows = torch.arange(state.enc.out.size(0)).repeat_interleave(state.group)
        logits = self.model.decode_full(prefix, state.enc.select(rows))[:, -1:]
        return logits, UncachedState(state.enc, prefix, state.group)


@torch.inference_mode()
@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_cached_decoding_equals_uncached(positional):
    model = tiny_model(positional=positional, max_positions=64)
    src = random_src(10, seed=3)
    cfg = SearchConfig(beam=4, lenpen=0.6, max_len_a=1.0, max_len_b=8, nbest=3)
    cached = beam_search(EnsembleModel([model]), src, cfg)
    plain = beam_search(EnsembleModel([Uncached(model)]), src, cfg)
    assert [[h.tokens for h in r] for r in cached] == [[h.tokens for h in r] for r in plain]
    for rc, rp in zip(cached, plain):
        for hc, hp in zip(rc, rp):
            assert hc.score == pytest.approx(hp.score, abs=1e-4)
            assert hc.token_scores == pytest.approx(hp.token_scores, abs=1e-4)


class NeverStops(Wrapped):
    """The real model, except that it never wants to stop: its eos logit is lowered by 30
    (p(eos) < 1e-13 of the likeliest token's), so only the length limit ends a hypothesis."""

    def init_state(self, enc, group=1):
        return self.model.init_state(enc, group=group)

    def decode(self, prev, state):
        logits, state = self.model.decode(prev, state)
        lower = torch.zeros(logits.size(-1), dtype=logits.dtype)
        lower[EOS] = 30.0
        return logits - lower, state


@torch.inference_mode()
@pytest.mark.parametrize("positional, max_positions, a, b, src_len", [
    ("learned", 6, 1.0, 50, 4),         # every sentence capped by the positions: 5 + eos
    ("learned", 8, 1.5, 1, 7),          # floor(1.5 n + 1) for short sources, 7 for long ones
    ("sinusoidal", None, 0.7, 2, 9),    # no position limit: floor(0.7 n + 2) alone
])
def test_max_length_respects_learned_positions(positional, max_positions, a, b, src_len):
    model = tiny_model(positional=positional, max_positions=max_positions or 64)
    assert model.max_positions == max_positions
    src = random_src(12, seed=4, max_len=src_len)
    res = beam_search(EnsembleModel([NeverStops(model)]), src,
                      SearchConfig(beam=2, nbest=2, max_len_a=a, max_len_b=b).resolve())
    capped = 0
    for row, hyps in zip(src, res):
        n = int(row.ne(PAD).sum()) - 1                  # source length without eos
        limit = math.floor(a * n + b)
        if max_positions is not None and limit > max_positions - 1:
            # the decoder reads bos + max_len tokens, at most max_positions positions
            limit, capped = max_positions - 1, capped + 1
        for h in hyps:
            # exactly the capped length, then the forced eos (and no eos before it)
            assert len(h.tokens) == limit + 1, (n, h.tokens)
            assert h.tokens[-1] == EOS and EOS not in h.tokens[:-1]
            assert math.isfinite(h.score)
    assert len(res) == 12
    if max_positions is None:
        assert capped == 0
    elif b == 50:
        assert capped == 12
    else:
        assert 0 < capped < 12                          # both limits were exercised


@torch.inference_mode()
def test_ensemble_averages_probabilities():
    m1, m2 = tiny_model(seed=0), tiny_model(seed=5)
    src = random_src(4, seed=6)
    ens = EnsembleModel([m1, m2])
    state = ens.init_state(ens.encode(src), group=1)
    p, _ = ens.step(torch.full((4, 1), BOS), state)
    p1 = torch.softmax(m1(src, torch.full((4, 1), BOS))[:, -1], -1)
    p2 = torch.softmax(m2(src, torch.full((4, 1), BOS))[:, -1], -1)
    assert torch.allclose(p, (p1 + p2) / 2, atol=1e-6)
    res = beam_search(ens, src, SearchConfig(beam=3, max_len_b=5).resolve())
    assert all(r[0].tokens[-1] == EOS for r in res)


# --- length penalty formulas: fairseq's and transformers' ---------------------------

def reference_beam_rule(dist, key, beam, alpha, max_len, formula):
    """reference_beam with lp(|Y|) = |Y|^alpha, and, for "hf", transformers' rule for when a
    sentence is done (early_stopping=False): ``beam`` finished hypotheses and the best live
    one, normalized at its current length, no better than the worst of the ``beam`` best
    (and the eos forced at the length limit scoring 0)."""
    live, finished = [((), 0.0)], []
    for step in range(max_len + 1):
        cands = []
        for b, (prefix, score) in enumerate(live):
            p = dist(key, prefix)
            for tok in range(V):
                if p[tok] > 0 and (step < max_len or tok == EOS):
                    # transformers' forced eos (at the length limit) has log-probability 0
                    lp = 0.0 if step == max_len and formula == "hf" else math.log(p[tok])
                    cands.append((score + lp, b * V + tok, b, tok))
        cands.sort(key=lambda c: (-c[0], c[1]))
        cands = cands[:2 * beam]
        for j, (s, _, b, tok) in enumerate(cands):
            if tok == EOS and j < beam:
                finished.append((s / (step + 1) ** alpha, live[b][0] + (EOS,)))
        live = [(live[b][0] + (tok,), s) for s, _, b, tok in cands if tok != EOS][:beam]
        if not live:
            break
        kept = sorted((f[0] for f in finished), reverse=True)[:beam]
        if len(kept) >= beam and (formula == "fairseq"
                                  or live[0][1] / (step + 1) ** alpha <= kept[-1]):
            break
    return max(finished, key=lambda f: f[0])


def test_length_penalty_formulas():
    assert length_penalty(7, 1.0, "fairseq") == 7.0
    assert length_penalty(7, 0.5, "hf") == pytest.approx(7 ** 0.5)
    assert length_penalty(7, 0.0, "fairseq") == 1.0
    assert length_penalty(torch.tensor([2, 8]), 1.0, "fairseq").tolist() == [2.0, 8.0]
    assert length_penalty(7, 0.6) == length_penalty(7, 0.6, "gnmt")
    with pytest.raises(ValueError, match="unknown length penalty formula"):
        length_penalty(3, 1.0, "marian")
    with pytest.raises(UsageError, match="unknown length penalty formula"):
        SearchConfig(lenpen_formula="marian")
    # the preset's formula fills an unset one; a config without it decodes as GNMT
    assert SearchConfig(beam=2).resolve(nmt.get_arch("transformer_tiny", {
        "lenpen_formula": "hf"})).lenpen_formula == "hf"
    assert SearchConfig(beam=2, lenpen=1.0, max_len_a=0, max_len_b=3).formula == "gnmt"


@pytest.mark.parametrize("formula", ["fairseq", "hf"])
@pytest.mark.parametrize("beam,alpha", [(2, 1.0), (4, 1.0), (3, 0.5), (5, 2.0)])
def test_fairseq_and_hf_formulas_match_their_reference(formula, beam, alpha):
    keys = list(range(40, 70))
    src = torch.tensor([[k, EOS] for k in keys])
    cfg = SearchConfig(beam=beam, lenpen=alpha, lenpen_formula=formula, max_len_a=0.0,
                       max_len_b=8)
    got = beam_search(EnsembleModel([ScriptedModel(random_dist)]), src, cfg)
    for k, hyps in zip(keys, got):
        score, tokens = reference_beam_rule(random_dist, k, beam, alpha, 8, formula)
        assert hyps[0].tokens == list(tokens)
        assert hyps[0].score == pytest.approx(score, abs=1e-4)


def test_hf_rule_goes_on_where_fairseq_stops():
    # beam 2, alpha 1: "</s>" (log .5 = -0.69) finishes at step 0, "A </s>" (log .15 / 2 =
    # -0.95) at step 1: two finished, so fairseq's rule stops with "</s>". transformers' goes
    # on, since the best live "B C" (log .2 / 2 = -0.80 at its current length) beats the worst
    # finished (-0.95), and finds "B C </s>" (log .2 / 3 = -0.54).
    tree = {12: {(): {EOS: .5, A: .3, B: .2}, (A,): {EOS: .5, D: .5},
                 (B,): {C: 1.0}, (B, C): {EOS: 1.0}, (A, D): {EOS: 1.0}}}
    dist = table_dist(tree)
    fairseq = run(dist, [12], beam=2, lenpen=1.0, lenpen_formula="fairseq")[0][0]
    hf = run(dist, [12], beam=2, lenpen=1.0, lenpen_formula="hf")[0][0]
    assert fairseq.tokens == [EOS]
    assert hf.tokens == [B, C, EOS]
    assert hf.score == pytest.approx(math.log(.2) / 3, abs=1e-5)


def test_the_forced_eos_at_the_length_limit_keeps_the_models_probability():
    """A prefix cut by the length limit, or min_len beyond it, forbids eos at the limit; the
    eos forced there is scored with the model's probability (log 0.2), not the 1e-30 floor
    those constraints had left (-69.08)."""
    from nmt.search.prefix import PrefixConstraints

    def dist(key, prefix):
        p = np.zeros(V)
        p[[A, B, EOS]] = [.5, .3, .2]
        return p

    src = torch.tensor([[10, EOS]])
    model = EnsembleModel([ScriptedModel(dist)])
    cut = beam_search(model, src, SearchConfig(beam=2, lenpen=0.0, max_len_a=0.0, max_len_b=2),
                      constraints=PrefixConstraints([[A, A, A, A]]))[0][0]
    late = beam_search(model, src, SearchConfig(beam=2, lenpen=0.0, max_len_a=0.0,
                                                max_len_b=2, min_len=5))[0][0]
    for h in (cut, late):
        assert h.tokens[-1] == EOS and h.token_scores[-1] == pytest.approx(np.log(0.2))


def test_a_negative_unkpen_does_not_stop_the_search_early():
    """unkpen < 0 multiplies <unk>'s probability by more than 1: a live score can still rise,
    so the early-stop bound does not hold, and the 1-best is the n-best list's first."""
    tree = {10: {(): {EOS: .6, A: .4}, (A,): {UNK: .5, B: .5}, (A, UNK): {EOS: 1.0},
                 (A, B): {EOS: 1.0}}}
    src = torch.tensor([[10, EOS]])
    best = []
    for nbest in (1, 2):
        cfg = SearchConfig(beam=2, nbest=nbest, lenpen=0.0, max_len_a=0.0, max_len_b=5,
                           unkpen=-3.0)
        best.append(beam_search(EnsembleModel([ScriptedModel(table_dist(tree))]), src,
                                cfg)[0][0])
    assert best[0].tokens == best[1].tokens == [A, UNK, EOS]
    assert best[0].score == pytest.approx(np.log(.4) + np.log(.5) + 3.0)


def test_sampling_top_k_keeps_k_tokens_even_on_ties():
    from nmt.search.config import SamplingConfig
    from nmt.search.sampling import filter_distribution

    probs = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.5, 0.25, 0.25, 0.0]])
    q = filter_distribution(probs, SamplingConfig(topk=2))
    assert int(q.gt(0).sum()) == 2 and q[0, 4] == 0.5


def test_sampling_temperature_sharpens_and_a_tiny_one_keeps_the_top_token():
    from nmt.search.config import SamplingConfig
    from nmt.search.sampling import filter_distribution

    probs = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.1, 0.8, 0.0]])
    q = filter_distribution(probs, SamplingConfig(temperature=0.5))
    want = probs ** 2 / (probs ** 2).sum(1, keepdim=True)
    assert torch.allclose(q, want, atol=1e-6)
    # p ** (1 / 1e-40) overflows float32 however it is written: the limit, the top token
    tiny = filter_distribution(probs, SamplingConfig(temperature=1e-40))
    assert torch.equal(tiny, torch.tensor([[1.0, 0, 0, 0], [0, 0, 1.0, 0]]))


def test_a_forced_prefix_token_keeps_its_probability_under_the_controls():
    """--no-repeat-ngram-size bans a token the prefix forces (A A with n = 1): the prefix
    wins with the model's probability, not the 1e-30 floor the ban left (-69.08)."""
    from nmt.search.prefix import PrefixConstraints

    def dist(key, prefix):
        p = np.zeros(V)
        p[[A, B, C, EOS]] = [.4, .3, .2, .1]
        return p

    src = torch.tensor([[10, EOS]])
    cfg = SearchConfig(beam=2, lenpen=0.0, max_len_a=0.0, max_len_b=5, no_repeat_ngram_size=1)
    h = beam_search(EnsembleModel([ScriptedModel(dist)]), src, cfg,
                    constraints=PrefixConstraints([[A, A]]))[0][0]
    assert h.tokens[:2] == [A, A]
    assert h.token_scores[:2] == pytest.approx([np.log(.4)] * 2)
    assert A not in h.tokens[2:]                        # the ban holds after the prefix
