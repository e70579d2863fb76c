"""Constrained decoding of linearized trees (nmt.search.constraints), rule by rule.

Scripted models (tests/test_search.py's ScriptedModel) prefer a forbidden token at a chosen
step; the unconstrained search emits it, the constrained one never does, and every constrained
output de-linearizes with no repair (nmt.tasks.parsing.delinearize's repair counts stay 0).
The last tests go through the real nmt-generate with a tiny (untrained) parsing checkpoint.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import nmt
from nmt import checkpoint as ckpt_io
from nmt.checkpoint import save_checkpoint
from nmt.cli.generate import main as generate_main
from nmt.data.codec import whitespace_codec
from nmt.data.dictionary import Dictionary
from nmt.errors import UsageError
from nmt.search.constraints import (FLOOR, TreeConstraints, TreeVocab, is_tree_vocabulary,
                                    tree_constraints_for)
from nmt.search.ensemble import EnsembleModel
from nmt.search.generator import SearchConfig, beam_search
from nmt.search.translator import Translator
from nmt.tasks.parsing import delinearize

from test_search import ScriptedModel
from test_translator import make_checkpoint

PAD, BOS, EOS, UNK = 0, 1, 2, 3
TREE_SYMBOLS = ["XX", "(S", ")S", "(NP", ")NP", "(VP", ")VP"]
XX, OS, CS, ONP, CNP, OVP, CVP = range(4, 11)
V = 11
DICT = Dictionary(TREE_SYMBOLS)
SYM = DICT.symbols
OPENS, CLOSES = {OS, ONP, OVP}, {CS, CNP, CVP}


def scripted(script=(), fallback=(XX, OS, ONP, CNP, CS, EOS, OVP, CVP, UNK), zeros=False):
    """dist(key, prefix): at step t = len(prefix) the token ``script[t]`` (when given) gets .9;
    the rest goes to ``fallback`` in decreasing shares, so the constrained search's choices are
    predictable (the best allowed token of the fallback order). ``zeros``: only the preferred
    token has a probability, every other token 0."""
    base = np.zeros(V)
    for rank, tok in enumerate(fallback):
        base[tok] = 0.5 ** rank
    base /= base.sum()

    def dist(key, prefix):
        t = len(prefix)
        pref = script[t] if t < len(script) else (script[-1] if zeros else None)
        if pref is None:
            return base.copy()
        p = np.zeros(V) if zeros else base * 0.1
        p[pref] += 1.0 if zeros else 0.9
        return p
    return dist


def sources(*n_words, key=20):
    """Right-padded source batch: one row per sentence with ``n`` words (the first one is the
    scripted model's key), then eos."""
    width = max(n_words) + 1
    rows = [[key] + [30] * (n - 1) + [EOS] + [PAD] * (width - n - 1) for n in n_words]
    return torch.tensor(rows)


def search(dist, src, constrained=True, beam=3, nbest=1, max_len_a=2.0, max_len_b=4,
           lenpen=0.6):
    cfg = SearchConfig(beam=beam, nbest=nbest, lenpen=lenpen, max_len_a=max_len_a,
                       max_len_b=max_len_b)
    cons = TreeConstraints(DICT) if constrained else None
    return beam_search(EnsembleModel([ScriptedModel(dist)]), src, cfg, constraints=cons)


def repairs(ids, n_words) -> Counter:
    stats: Counter = Counter()
    delinearize(DICT.string(ids), [f"w{i}" for i in range(n_words)], stats=stats)
    return +stats


def best(dist, n_words, **kw):
    """The best output for one sentence; greedy unless told (so that each step's choice is the
    best allowed token of the script)."""
    kw.setdefault("beam", 1)
    return search(dist, sources(n_words), **kw)[0][0].tokens


# --- the vocabulary ---------------------------------------------------------------------------

def test_vocabulary_classes_and_detection():
    v = TreeVocab.build(Dictionary(TREE_SYMBOLS + [")"]))
    assert v.xx == XX and v.size == V + 1
    assert v.open_label[OS] == v.close_label[CS] != v.open_label[ONP] == v.close_label[CNP]
    assert (v.open_label[[PAD, BOS, EOS, UNK, XX, CS]] == -1).all()
    assert (v.close_label[[PAD, EOS, XX, OS]] == -1).all() and v.close_any.tolist()[-1]
    assert is_tree_vocabulary(DICT)
    assert not is_tree_vocabulary(Dictionary(TREE_SYMBOLS + ["dog"]))     # a word: not trees
    assert not is_tree_vocabulary(Dictionary(["(S", ")S"]))                # no XX
    assert tree_constraints_for(Dictionary(["a", "b"])) is None
    assert tree_constraints_for(DICT, False) is None
    assert isinstance(tree_constraints_for(DICT), TreeConstraints)
    assert isinstance(tree_constraints_for(Dictionary(TREE_SYMBOLS + ["a"]), True),
                      TreeConstraints)
    with pytest.raises(UsageError, match="XX"):
        tree_constraints_for(Dictionary(["a", "b"]), True)


# --- one rule at a time -----------------------------------------------------------------------

def test_never_closes_a_bracket_that_is_not_open():
    dist = scripted([CNP, CNP, CNP])
    free = best(dist, 2, constrained=False)
    assert free[0] == CNP and repairs(free, 2)["extra_close"] > 0
    out = best(dist, 2)
    assert out[0] not in CLOSES and not repairs(out, 2), DICT.string(out)


def test_closes_only_with_the_open_label():
    dist = scripted([OS, ONP, XX, CS, CS])              # ")S" while "(NP" is innermost
    free = best(dist, 1, constrained=False)
    assert free[:4] == [OS, ONP, XX, CS] and repairs(free, 1)["label_mismatch"] == 1
    out = best(dist, 1)
    assert out[:3] == [OS, ONP, XX] and out[3] == CNP
    assert out == [OS, ONP, XX, CNP, CS, EOS] and not repairs(out, 1)


def test_never_more_xx_than_source_words():
    dist = scripted([XX] * 20)
    free = best(dist, 3, constrained=False)
    assert free.count(XX) > 3 and repairs(free, 3)["extra_xx"] > 0
    assert best(dist, 3) == [XX, XX, XX, EOS]


def test_no_eos_before_every_word_and_bracket():
    dist = scripted([OS, XX, EOS, EOS, EOS])
    free = best(dist, 3, constrained=False)
    assert free == [OS, XX, EOS] and repairs(free, 3) == Counter(missing_close=1, missing_xx=2)
    out = best(dist, 3)
    assert out[:2] == [OS, XX] and out.count(XX) == 3 and not repairs(out, 3)


def test_no_empty_constituent():
    dist = scripted([OS, ONP, CNP, CNP])               # "(NP )NP" would be pruned: a repair
    assert repairs(best(dist, 1, constrained=False), 1)["empty_constituent"] > 0
    out = best(dist, 1)
    assert out[:3] == [OS, ONP, XX] and not repairs(out, 1)


def test_length_cap_leaves_room_to_close():
    # Brackets preferred forever: 2 words and at most 6 tokens before eos.
    dist = scripted([OS] * 30, fallback=(OS, ONP, CS, CNP, XX, EOS))
    free = best(dist, 2, constrained=False, max_len_a=0, max_len_b=6)
    assert free == [OS] * 6 + [EOS] and repairs(free, 2)
    out = best(dist, 2, max_len_a=0, max_len_b=6)
    # Two opens, then only what is needed: the budget equals what remains to emit (a word
    # outside every bracket is a tree too: (TOP (S (S (XX w0))) (XX w1))).
    assert out == [OS, OS, XX, CS, CS, XX, EOS] and not repairs(out, 2), DICT.string(out)
    for budget in range(2, 12):
        out = best(dist, 2, beam=2, max_len_a=0, max_len_b=budget)
        assert len(out) <= budget + 1 and not repairs(out, 2), (budget, DICT.string(out))


def test_when_the_budget_equals_the_need_only_needed_tokens_are_allowed():
    cons = TreeConstraints(DICT)
    state = cons.start(sources(2), 1, torch.tensor([5]))
    state = state.advance(torch.tensor([0]), torch.tensor([OS]))       # "(S": need 3, budget 4
    allowed = (~state.forbidden(1))[0].nonzero().squeeze(1).tolist()
    assert allowed == [XX]                     # no open (no room), no close ((S is empty)
    state = state.advance(torch.tensor([0]), torch.tensor([XX]))       # need 2, budget 3
    assert (~state.forbidden(2))[0].nonzero().squeeze(1).tolist() == [XX, CS]
    wide = cons.start(sources(2), 1, torch.tensor([9])).advance(torch.tensor([0]),
                                                                torch.tensor([OS]))
    assert (~wide.forbidden(1))[0].nonzero().squeeze(1).tolist() == [XX, OS, ONP, OVP]


def test_a_tree_the_model_prefers_is_left_alone_however_deep():
    # 25 nested constituents: the label stack widens past its first 8 columns on the way.
    script = [OS, ONP, OVP] * 8 + [OS, XX] + [CS] + [CVP, CNP, CS] * 8 + [EOS]
    dist = scripted(script)
    for beam in (1, 3):
        free = best(dist, 1, beam=beam, constrained=False, max_len_a=0, max_len_b=60)
        assert free == script and not repairs(free, 1)
        assert best(dist, 1, beam=beam, max_len_a=0, max_len_b=60) == free


def test_too_short_a_length_limit_is_best_effort():
    # 5 words, 3 tokens allowed: no tree fits; only XX are emitted, then the forced eos.
    assert best(scripted([OS] * 9), 5, max_len_a=0, max_len_b=3) == [XX, XX, XX, EOS]


def test_zero_probabilities_still_reach_a_tree():
    dist = scripted([ONP] * 30, zeros=True)            # the model gives every other token 0
    out = best(dist, 2, max_len_a=0, max_len_b=7)
    assert not repairs(out, 2) and out[-1] == EOS
    hyp = search(dist, sources(2), max_len_a=0, max_len_b=7)[0][0]
    assert min(hyp.token_scores) == pytest.approx(np.log(FLOOR), rel=1e-3)


def test_bare_close_bracket_closes_any_label():
    d = Dictionary(TREE_SYMBOLS + [")"])
    cons = TreeConstraints(d)
    state = cons.start(sources(1), 1, torch.tensor([6]))
    for tok in (ONP, XX):
        state = state.advance(torch.tensor([0]), torch.tensor([tok]))
    allowed = (~state.forbidden(2))[0].nonzero().squeeze(1).tolist()
    assert allowed == [CNP, V]                 # ")NP" and ")", not ")S" / ")VP"


def test_advance_follows_the_reselected_beam():
    cons = TreeConstraints(DICT)
    state = cons.start(sources(3, 2), 2, torch.tensor([9, 8]))          # 4 rows
    state = state.advance(torch.arange(4), torch.tensor([OS, ONP, XX, OVP]))
    state = state.advance(torch.tensor([1, 1, 3, 2]), torch.tensor([XX, ONP, XX, EOS]))
    assert state.depth.tolist() == [1, 2, 1, 0]
    assert state.n_xx.tolist() == [1, 0, 1, 1]
    assert state.n_words.tolist() == [3, 3, 2, 2]
    assert state.max_len.tolist() == [9, 9, 8, 8]
    assert state.empty_top.tolist() == [False, True, False, False]
    closes = [[i for i in (CS, CNP, CVP) if not f[i]] for f in state.forbidden(2).tolist()]
    assert closes == [[CNP], [], [CVP], []]


# --- whatever the model, every hypothesis is a tree -------------------------------------------

def random_dist(key, prefix):
    rng = np.random.default_rng(abs(hash((key, prefix))) % (2 ** 32))
    return rng.dirichlet(np.full(V, 0.3))


@pytest.mark.parametrize("beam,max_len_a,max_len_b", [(1, 3.0, 2), (3, 2.0, 4), (5, 1.0, 3),
                                                       (4, 1.0, 0), (2, 0.0, 9)])
def test_random_models_give_trees_only(beam, max_len_a, max_len_b):
    n_words = [1, 2, 3, 5, 4, 1, 6]
    src = torch.cat([sources(*n_words, key=k) for k in (20, 21, 22)])
    lengths = n_words * 3
    res = search(random_dist, src, beam=beam, nbest=beam, max_len_a=max_len_a,
                 max_len_b=max_len_b)
    free = search(random_dist, src, constrained=False, beam=beam, max_len_a=max_len_a,
                  max_len_b=max_len_b)
    n_ill_formed = 0
    for n, hyps, free_hyps in zip(lengths, res, free):
        limit = int(max_len_a * n + max_len_b)
        assert 1 <= len(hyps) <= beam           # fewer when fewer trees fit in the limit
        for h in hyps:
            if n <= limit:             # a tree fits in the length limit
                assert not repairs(h.tokens, n), (n, DICT.string(h.tokens))
            assert len(h.tokens) <= limit + 1 and h.tokens[-1] == EOS
        n_ill_formed += bool(repairs(free_hyps[0].tokens, n))
    assert n_ill_formed > len(lengths) // 2            # the models do need the constraints


def test_without_constraints_the_search_is_unchanged():
    src = torch.cat([sources(1, 3, 2, key=k) for k in (20, 21)])
    cfg = SearchConfig(beam=3, nbest=2, lenpen=0.6, max_len_a=2.0, max_len_b=3)
    plain = beam_search(EnsembleModel([ScriptedModel(random_dist)]), src, cfg)
    none = beam_search(EnsembleModel([ScriptedModel(random_dist)]), src, cfg, constraints=None)
    assert [[(h.tokens, h.score) for h in s] for s in plain] == \
        [[(h.tokens, h.score) for h in s] for s in none]


# --- through nmt-generate ---------------------------------------------------------------------

SOURCE_WORDS = [f"w{i}" for i in range(12)]
LABELS = ["S", "NP", "VP", "PP", "ADJP", "SBAR"]
TARGET_SYMBOLS = ["XX"] + [b + lab for lab in LABELS for b in "()"]


def parsing_checkpoint(path, seed=0):
    """A tiny untrained checkpoint of a parsing data directory: words in, trees out."""
    torch.manual_seed(seed)
    src, tgt = whitespace_codec(Dictionary(SOURCE_WORDS)), whitespace_codec(
        Dictionary(TARGET_SYMBOLS))
    cfg = nmt.get_arch("transformer_tiny", {"dropout": 0.0, "max_len_b": 10})
    model = nmt.build_model(cfg, len(src.dictionary), len(tgt.dictionary),
                            share_all_embeddings=False).eval()
    save_checkpoint(ckpt_io.make_checkpoint(
        model_config=cfg, model_state=model.state_dict(), share_all_embeddings=False,
        src_codec=src, tgt_codec=tgt, src_lang="words", tgt_lang="lin", data_dir=""), path)
    return path


def generate(*args, ok=True):
    res = CliRunner().invoke(generate_main, ["-q", "--device", "cpu", *map(str, args)])
    if ok:
        assert res.exit_code == 0, (res.output, res.stderr, res.exception)
    return res


def random_sentences(tmp_path, n=12):
    """n sentences of 1-6 words (some unknown to the checkpoints), and the file holding them."""
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(SOURCE_WORDS + ["unseen"], size=int(rng.integers(1, 7))))
             for _ in range(n)]
    src = tmp_path / "test.words"
    src.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return lines, src


def test_nmt_generate_constrains_parsing_checkpoints_by_default(tmp_path):
    ckpt = parsing_checkpoint(tmp_path / "parse.pt")
    lines, src = random_sentences(tmp_path)

    out = generate(ckpt, "-i", src).stdout.splitlines()
    assert len(out) == len(lines)
    for words, seq in zip(lines, out):
        assert seq.split()[-1].startswith(")") or len(words.split()) == seq.split().count("XX")
        stats: Counter = Counter()
        delinearize(seq, words.split(), stats=stats)
        assert not +stats, (words, seq, stats)

    free = generate(ckpt, "-i", src, "--no-tree-constraints").stdout.splitlines()
    t = Translator.from_checkpoint(ckpt, device="cpu")
    assert t.constraints is not None and t.translate(lines) == out
    t.constraints = None
    assert t.translate(lines) == free != out
    n_repaired = 0
    for words, seq in zip(lines, free):
        stats = Counter()
        delinearize(seq, words.split(), stats=stats)
        n_repaired += bool(+stats)
    assert n_repaired > 0                     # the untrained model does need the constraints
    forced = generate(ckpt, "-i", src, "--tree-constraints").stdout
    assert forced.splitlines() == out


def test_samples_of_a_parsing_checkpoint_are_trees_too(tmp_path):
    """--sampling draws under the same tree constraints as beam search."""
    ckpt = parsing_checkpoint(tmp_path / "parse.pt")
    lines, src = random_sentences(tmp_path)
    out = generate(ckpt, "-i", src, "--sampling", "--nbest", 2, "--seed", 3).stdout.splitlines()
    assert len(out) == 2 * len(lines)
    for i, seq in enumerate(out):
        stats: Counter = Counter()
        delinearize(seq, lines[i // 2].split(), stats=stats)
        assert not +stats, (lines[i // 2], seq, stats)
    free = generate(ckpt, "-i", src, "--sampling", "--nbest", 2, "--seed", 3,
                    "--no-tree-constraints").stdout.splitlines()
    n_repaired = 0
    for i, seq in enumerate(free):
        stats = Counter()
        delinearize(seq, lines[i // 2].split(), stats=stats)
        n_repaired += bool(+stats)
    assert n_repaired > 0                     # without them the untrained model's samples break


def test_nmt_generate_leaves_translation_checkpoints_alone(tmp_path):
    ckpt = make_checkpoint(tmp_path / "mt.pt")
    src = tmp_path / "in.txt"
    src.write_text("w1 w2 w3\nw4\n", encoding="utf-8")
    assert Translator.from_checkpoint(ckpt, device="cpu").constraints is None
    assert generate(ckpt, "-i", src).stdout == generate(ckpt, "-i", src,
                                                        "--no-tree-constraints").stdout
    res = generate(ckpt, "-i", src, "--tree-constraints", ok=False)
    assert res.exit_code != 0 and "XX" in res.stderr and "Traceback" not in res.stderr
    assert "--no-tree-constraints" in generate("--help").stdout


# --- lexicalized trees (prepare.py --leaves words): the leaf is the next source word ----------

LEX = Dictionary(["(S", ")S", "(NP", ")NP", "(VP", ")VP", "(PP", ")PP", "the", "dog", "runs"])
THE, DOG, RUNS = 12, 13, 14


def test_lexicalized_vocabulary_is_recognized():
    assert TreeVocab.build(LEX).lexical and not TreeVocab.build(DICT).lexical
    v = TreeVocab.build(LEX)
    assert v.leaf[[THE, DOG, RUNS, UNK]].all() and not v.leaf[[PAD, EOS, 4, 5]].any()
    assert isinstance(tree_constraints_for(LEX), TreeConstraints)
    # brackets of fewer than 3 labels, or lower-case "labels": an ordinary vocabulary
    assert not is_tree_vocabulary(Dictionary(["(S", ")S", "(NP", ")NP", "the"]))
    assert not is_tree_vocabulary(Dictionary(["(a", ")a", "(b", ")b", "(c", ")c"]))


@pytest.mark.parametrize("src_dict", [None, Dictionary(["runs", "dog", "the", "cat"])])
def test_lexicalized_leaves_are_the_source_words_in_order(src_dict):
    """The model always prefers "runs"; the constrained search still writes the, dog, runs
    (in target ids, also when the source dictionary numbers the words differently)."""
    n = len(LEX)

    def dist(key, prefix):
        p = np.full(n, 0.01)
        p[RUNS] = 1.0
        p[[PAD, BOS]] = 0.0
        return p / p.sum()

    if src_dict is None:
        src = torch.tensor([[THE, DOG, RUNS, EOS]])
    else:
        src = torch.tensor([[src_dict.index(w) for w in ("the", "dog", "runs")] + [EOS]])
    cfg = SearchConfig(beam=2, nbest=1, lenpen=0.6, max_len_a=2.0, max_len_b=4)
    out = beam_search(EnsembleModel([ScriptedModel(dist)]), src, cfg,
                      constraints=TreeConstraints(LEX, src_dict))[0][0].tokens
    text = " ".join(LEX.string(out))
    assert [t for t in text.split() if not t.startswith(("(", ")"))] == ["the", "dog", "runs"]
    stats: Counter = Counter()
    delinearize(text, ["the", "dog", "runs"], stats=stats, leaves="words")
    assert not +stats, (text, stats)
    # The model always wants a word next (which word is not its decision): the forced word
    # gets the mass of all words, so no bracket is opened to put the words off. Scored by its
    # own probability (0.01), "the" would lose to opening brackets until the length ran out.
    assert text == "the dog runs"
    # unconstrained, the model repeats "runs"
    free = beam_search(EnsembleModel([ScriptedModel(dist)]), src, cfg)[0][0].tokens
    assert LEX.string(free)[0] == "runs"


def test_nmt_generate_spells_the_source_in_lexicalized_trees(tmp_path):
    """A joined dictionary of words and brackets (prepare.py --leaves words, nmt-preprocess
    --joined-dictionary): recognized as a parsing checkpoint, every output a tree whose leaves
    are the input's words in order (unknown words as <unk>), de-linearized without repair."""
    torch.manual_seed(1)
    brackets = [b + lab for lab in LABELS for b in "()"]
    codec = whitespace_codec(Dictionary(SOURCE_WORDS + brackets))
    cfg = nmt.get_arch("transformer_tiny", {"dropout": 0.0, "max_len_b": 10})
    model = nmt.build_model(cfg, len(codec.dictionary), len(codec.dictionary)).eval()
    ckpt = save_checkpoint(ckpt_io.make_checkpoint(
        model_config=cfg, model_state=model.state_dict(), share_all_embeddings=True,
        src_codec=codec, tgt_codec=codec, src_lang="words", tgt_lang="lin", data_dir=""),
        tmp_path / "lex.pt")
    lines, src = random_sentences(tmp_path)
    out = generate(ckpt, "-i", src).stdout.splitlines()
    assert len(out) == len(lines)
    for words, seq in zip(lines, out):
        leaves = [t for t in seq.split() if not t.startswith(("(", ")"))]
        assert leaves == [w if w != "unseen" else "<unk>" for w in words.split()], seq
        stats: Counter = Counter()
        delinearize(seq, words.split(), stats=stats, leaves="words")
        assert not +stats, (words, seq, stats)
    free = generate(ckpt, "-i", src, "--no-tree-constraints").stdout.splitlines()
    assert free != out


def test_lexicalized_trees_end_with_the_models_own_eos_probability():
    """Once every source word is placed, the eos keeps the model's probability: the words'
    mass (what a leaf gets) went into the eos column too, scoring each finished parse's eos
    by how likely a word was instead (log 0.003 where the model gave eos 0.987)."""
    n = len(LEX)

    def dist(key, prefix):
        p = np.full(n, 0.001)
        p[[PAD, BOS]] = 0
        if len(prefix) < 3:
            p[[THE, DOG, RUNS]] = 0.3
        else:
            p[EOS] = 0.9
        return p / p.sum()

    src = torch.tensor([[THE, DOG, RUNS, EOS]])
    cfg = SearchConfig(beam=1, lenpen=0.0, max_len_a=2.0, max_len_b=4)
    h = beam_search(EnsembleModel([ScriptedModel(dist)]), src, cfg,
                    constraints=TreeConstraints(LEX))[0][0]
    want = dist(0, (THE, DOG, RUNS))[EOS]
    assert h.token_scores[-1] == pytest.approx(float(np.log(want)), abs=1e-4)
