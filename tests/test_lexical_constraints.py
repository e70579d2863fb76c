"""Lexically constrained decoding (nmt.search.lexical): every constraint appears in
every output, dynamic beam allocation finds what a plain beam prunes, a line translates the
same whatever its batch, and nmt-generate's jsonl "constraints" (nmt-serve's field:
test_serve). Each test first shows what happens without constraints, so that it can fail."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from nmt.errors import NmtError, UsageError
from nmt.search.ensemble import EnsembleModel
from nmt.search.generator import beam_search
from nmt.search.lexical import LexicalConstraints, automaton, round_robin
from nmt.search.jsonl_input import parse_request
from nmt.search.sampling import SamplingConfig
from nmt.search.translator import BatchConfig, SearchConfig, Translator

from test_generate import run_quick_benchmark
from test_search import ScriptedModel, table_dist
from test_translator import WORDS, make_checkpoint, mixed_lines

ROOT = Path(__file__).resolve().parents[1]
EOS, UNK, A, B, C, D = 2, 3, 4, 5, 6, 7


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("lexical") / "tiny.pt", max_len_b=10)


def random_constraints(n, seed=0):
    """Per line, 1-3 constraints of 1-2 words."""
    rng = np.random.default_rng(seed)
    return [[" ".join(WORDS[int(j)] for j in rng.integers(0, len(WORDS), int(rng.integers(1, 3))))
             for _ in range(int(rng.integers(1, 4)))] for _ in range(n)]


def contains(ids, phrase):
    n = len(phrase)
    return any(list(ids[i:i + n]) == list(phrase) for i in range(len(ids) - n + 1))


# --- the search on a scripted model ---------------------------------------------------------

# Constraint C. The model gives C .05 at the first step and never again (unlisted prefixes:
# eos .5, unk .5); "C </s>" has P = .05. A beam of 2 keeps A (.6) and B (.35) and prunes C.
PRUNED = {20: {(): {A: .6, B: .35, C: .05}, (A,): {EOS: .9, D: .1}, (B,): {EOS: .9, D: .1},
               (C,): {EOS: 1.0}}}


class WithoutSelect:
    """The same constraints (eos forbidden while unmet, the length budget) in a plain top-k
    beam: what dynamic beam allocation adds is its own choice of candidates."""

    def __init__(self, inner):
        self.inner = inner

    def start(self, src, beam, max_len):
        return _Plain(self.inner.start(src, beam, max_len))


class _Plain:
    def __init__(self, state):
        self.state = state

    def restrict(self, probs, step):
        self.state.restrict(probs, step)

    def advance(self, rows, tokens):
        return _Plain(self.state.advance(rows, tokens))


def scripted(constraints, **kw):
    src = torch.tensor([[20, EOS]])
    cfg = SearchConfig(beam=2, lenpen=0.0, max_len_a=0.0, max_len_b=4, **kw)
    return beam_search(EnsembleModel([ScriptedModel(table_dist(PRUNED))]), src, cfg,
                       constraints=constraints)[0]


def test_dynamic_beam_allocation_keeps_what_a_plain_beam_prunes():
    assert [h.tokens for h in scripted(None)] == [[A, EOS]]          # unconstrained
    lex = LexicalConstraints([[[C]]])
    # A plain beam with the constraint's rules drops C at the first step; only the length
    # budget brings it back, as the last token, at the floor probability.
    plain = scripted(WithoutSelect(lex))[0]
    assert plain.tokens[-2:] == [C, EOS] and plain.tokens[0] != C
    assert plain.log_prob < math.log(1e-29)
    # Dynamic beam allocation keeps C in its own bank (met tokens 1) beside A (bank 0):
    # "C </s>" finishes at the second step with the model's own probability.
    best = scripted(lex, nbest=1)[0]
    assert best.tokens == [C, EOS]
    assert best.score == pytest.approx(math.log(.05), abs=1e-5)
    assert best.token_scores == pytest.approx([math.log(.05), 0.0], abs=1e-5)


def test_eos_waits_for_the_constraint_and_the_budget_forces_it():
    """Constraint "D D D": eos is never allowed before it; with max_len 4 the beam must spell
    it within 4 tokens though the model (unlisted prefixes) never predicts D."""
    for h in scripted(LexicalConstraints([[[D, D, D]]]), nbest=2):
        assert contains(h.tokens, [D, D, D]) and h.tokens[-1] == EOS and len(h.tokens) <= 5


def test_automaton_sees_overlapping_occurrences():
    a, b = 10, 11
    table = automaton([a, a, b])
    # progress 2 ("a a") then "a": the output ends with "a a" still (a plain reset says 1)
    assert table[2, 0] == 2 and table[2, 2] == 3 and table[1, 2] == 0 and table[0, 0] == 1
    lex = LexicalConstraints([[[a, a, b], [b, a]]])
    state = lex.start(torch.tensor([[5, EOS]]), 1, torch.tensor([10]))
    seen = []
    for tok in (a, a, a, b, a):
        state = state.advance(torch.tensor([0]), torch.tensor([tok]))
        seen.append(state.prog[0].tolist())
    assert seen == [[1, 0], [2, 0], [2, 0], [3, 1], [3, 2]]      # both met, "b a" overlapping


def test_round_robin_takes_each_bank_in_turn():
    scores = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -0.5, float("-inf")]])
    key = torch.arange(6).unsqueeze(0)
    bank = torch.tensor([[0, 0, 1, 2, 0, -1]])
    # banks 2: [3]; 1: [2]; 0: [4, 0, 1] (by score) -> 3, 2, 4, then 0, 1; impossible last
    assert round_robin(scores, key, bank).tolist() == [[3, 2, 4, 0, 1, 5]]


# --- a tiny real model ----------------------------------------------------------------------

def encoded(t, constraints):
    return [[list(t.tgt_codec.encode(c)) for c in cs] for cs in constraints]


def test_every_constraint_in_every_output(ckpt):
    lines = [x for x in mixed_lines(44, seed=5) if x.strip()][:40]
    cons = random_constraints(len(lines), seed=1)
    t = Translator.from_checkpoint(ckpt, search=SearchConfig(nbest=2))
    want = encoded(t, cons)
    plain = t.translate_results(lines)
    missing = sum(not all(contains(r.hypotheses[0].ids, c) for c in cs)
                  for r, cs in zip(plain, want))
    assert missing > 30                            # without constraints most outputs lack them
    assert any(len(c) == 2 for cs in want for c in cs)               # multi-token ones too
    out = t.translate_results(lines, constraints=cons)
    for r, cs in zip(out, want):
        assert len(r.hypotheses) == 2
        for h in r.hypotheses:
            assert h.ids[-1] == EOS and all(contains(h.ids[:-1], c) for c in cs), (h.ids, cs)
    # as text, too; and the scores are the model's log-probabilities of the outputs
    assert all(f" {c} " in f" {r.text} " for r, cs in zip(out, cons) for c in cs)
    from nmt.search.forced import score_ids

    forced = score_ids(t, [t.src_codec.encode(x) for x in lines[:6]],
                       [r.hypotheses[0].ids[:-1] for r in out[:6]])
    assert [r.hypotheses[0].score for r in out[:6]] == pytest.approx(
        [f.score for f in forced], abs=1e-4)


def test_same_output_whatever_the_batch(ckpt):
    lines = mixed_lines(40, seed=7)
    cons = random_constraints(len(lines), seed=2)
    for i in range(0, len(lines), 5):
        cons[i] = []                                 # some lines without constraints
    runs = []
    for kw in ({"batch_size": 1}, {"batch_size": 7}, {"max_tokens": 25}):
        t = Translator.from_checkpoint(ckpt, search=SearchConfig(nbest=2),
                                       batch=BatchConfig(**kw))
        runs.append([[(h.ids, h.score) for h in r.hypotheses]
                     for r in t.translate_results(lines, constraints=cons)])
    ids = [[[h[0] for h in r] for r in run] for run in runs]
    assert ids[1] == ids[0] and ids[2] == ids[0]
    scores = [[h[1] for r in run for h in r] for run in runs]
    assert all(x == pytest.approx(scores[0], abs=1e-4) for x in scores[1:])
    # a line without constraints, batched with constrained ones, gets plain beam search's
    plain = Translator.from_checkpoint(ckpt, search=SearchConfig(nbest=2)).translate_results(
        [lines[i] for i in range(0, len(lines), 5)])
    assert [[h.ids for h in r.hypotheses] for r in plain] == ids[1][::5]


def test_with_a_prefix_and_the_controls(ckpt):
    lines = [x for x in mixed_lines(20, seed=9) if x.strip()]
    cons = random_constraints(len(lines), seed=3)
    t = Translator.from_checkpoint(ckpt, search=SearchConfig(min_len=4, no_repeat_ngram_size=3))
    out = t.translate_results(lines, prefixes=["w7 w8"] * len(lines), constraints=cons)
    for r, cs in zip(out, encoded(t, cons)):
        ids = r.hypotheses[0].ids
        assert r.text.startswith("w7 w8") and len(ids) - 1 >= 4
        assert all(contains(ids, c) for c in cs)
        grams = [tuple(ids[i:i + 3]) for i in range(len(ids) - 1 - 2)]    # eos left out
        assert len(grams) == len(set(grams)), (r.text, ids)       # no 3-gram twice


def test_refused_in_one_line(ckpt):
    t = Translator.from_checkpoint(ckpt)
    with pytest.raises(NmtError, match=r"line 2: constraint 2 \('w3 zebra'\) cannot be spelled"):
        t.translate_results(["w1", "w2 w3"], constraints=[["w1"], ["w2", "w3 zebra"]])
    with pytest.raises(NmtError, match="line 5: constraint 1 .* empty once encoded"):
        t.translate_results(["w1"], constraints=[["  "]], first_line=5)
    # source of 1 word: at most 1 + 10 tokens; 12 constraint tokens cannot fit
    with pytest.raises(NmtError, match="line 1: its constraints need 12 target tokens, more "
                                       "than the 11"):
        t.translate_results(["w1"], constraints=[[" ".join(WORDS[:12])]])
    with pytest.raises(UsageError, match="diverse beam groups"):
        Translator.from_checkpoint(ckpt, search=SearchConfig(diverse_beam_groups=2)
                                   ).translate_results(["w1"], constraints=[["w2"]])
    with pytest.raises(UsageError, match="do not go with sampling"):
        Translator.from_checkpoint(ckpt, search=SearchConfig(nbest=1),
                                   sampling=SamplingConfig()).translate_results(
            ["w1"], constraints=[["w2"]])
    with pytest.raises(ValueError, match="one list of phrases per sentence"):
        t.translate_results(["w1"], constraints=["w2"])
    # an empty source gives an empty translation, as without constraints
    assert t.translate_results([""], constraints=[["w2"]])[0].text == ""


def test_jsonl_requests_check_their_constraints():
    r = parse_request('{"source": "a", "constraints": ["Hund", "rote Ball"]}', 1)
    assert r.constraints == ["Hund", "rote Ball"]
    assert parse_request('{"source": "a", "constraints": null}', 1).constraints is None
    for line, words in [('{"source": "a", "constraints": "Hund"}', "must be a list of strings"),
                        ('{"source": "a", "constraints": ["Hund", 3]}',
                         "\"constraints\"[1] must be a string, got a number"),
                        ('{"source": "a", "constraints": ["Hund", " "]}',
                         "\"constraints\"[1] is empty")]:
        with pytest.raises(NmtError, match=re.escape(words)) as e:
            parse_request(line, 7, "in.jsonl")
        assert str(e.value).startswith("in.jsonl: line 7: ")


def generate(args, **kw):
    """nmt-generate of this checkout (python -m from the repository root)."""
    return subprocess.run([sys.executable, "-m", "nmt.cli.generate", *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, **kw)


def test_nmt_generate_jsonl_constraints(ckpt, tmp_path):
    lines = mixed_lines(12, seed=4)
    cons = random_constraints(len(lines), seed=4)
    cons[1] = []
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"source": s, "constraints": c}) + "\n"
                           for s, c in zip(lines, cons)))
    r = generate([ckpt, "-i", src, "--input-format", "jsonl", "--output-format", "jsonl",
                  "--threads", 1, "-q"])
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    want = Translator.from_checkpoint(ckpt).translate_results(lines, constraints=cons)
    assert [x["translation"] for x in rows] == [w.text for w in want]
    for x, s, c in zip(rows, lines, cons):
        assert x.get("constraints") == (c or None)                   # echoed as given
        if s.strip():
            assert all(f" {w} " in f" {x['translation']} " for w in c)
    # an unknown word: exit 1, one line naming the line, nothing written
    src.write_text(json.dumps({"source": "w1", "constraints": ["w2"]}) + "\n"
                   + json.dumps({"source": "w2 w3", "constraints": ["w4 zebra"]}) + "\n")
    r = generate([ckpt, "-i", src, "--input-format", "jsonl", "--threads", 1, "-q"])
    assert r.returncode == 1 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1
    assert "line 2: constraint 1 ('w4 zebra') cannot be spelled" in r.stderr


def test_benchmark_quick_mode(tmp_path):
    """benchmarks/bench_constraints.py --quick runs end to end and reports what it promises."""
    stdout, rep = run_quick_benchmark("bench_constraints.py", tmp_path, "--lines", "12")
    assert "sentences/s" in stdout and "BLEU" in stdout
    assert [row["constraints"] for row in rep["settings"]] == [0, 1, 3]
    for row in rep["settings"]:
        assert row["sentences_per_s"] > 0 and 0 <= row["bleu"] <= 100
    one, three = rep["settings"][1:]
    assert one["constrained_lines"] == 12 and three["constraint_words"] > 24
    assert one["all_constraints_present"] == three["all_constraints_present"] == 1.0
