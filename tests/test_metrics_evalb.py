"""Bracket scores against hand-computed cases, against EVALB's own output (COLLINS.prm) and
against the pinned EVALB release compiled here (tests/fixtures/evalb/README.md)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from nmt.cli.score import main as score_main
from nmt.errors import NmtError
from nmt.metrics.evalb import EvalbParams, evaluate, format_report, retag_xx
from nmt.io import read_lines

FIX = Path(__file__).resolve().parent / "fixtures" / "parsing"
EVALB_FIX = Path(__file__).resolve().parent / "fixtures" / "evalb"
UNLABELED_PRM = Path(__file__).resolve().parents[1] / "examples" / "parsing_wsj" / \
    "COLLINS_unlabeled.prm"

GOLD = "(TOP (S (NP (DT The) (NN dog)) (VP (VBZ chews) (NP (NNS bones))) (. .)))"
# Gold brackets (punctuation removed first): S[0,4] NP[0,2] VP[2,4] NP[3,4].


def score(gold: str, test: str, **kw):
    return evaluate([gold], [test], **kw)


def test_identical_trees_score_100():
    r = score(GOLD, GOLD)
    a = r.all
    assert (a.match, a.gold, a.test) == (4, 4, 4)
    assert a.f1 == a.precision == a.recall == a.exact_match == 100.0
    assert a.crossing == 0 and a.tagging_accuracy == 100.0


def test_one_wrong_label():
    r = score(GOLD, GOLD.replace("(VP", "(ADJP"))
    assert (r.all.match, r.all.gold, r.all.test) == (3, 4, 4)
    assert r.all.f1 == pytest.approx(75.0) and r.all.exact_match == 0.0


def test_one_crossing_bracket():
    test = "(TOP (S (DT The) (NP (NN dog) (VBZ chews)) (VP (NP (NNS bones))) (. .)))"
    # Test S[0,4] NP[1,3] VP[3,4] NP[3,4]: S and NP[3,4] match; NP[1,3] crosses gold NP[0,2].
    r = score(GOLD, test)
    assert (r.all.match, r.all.gold, r.all.test, r.all.crossing) == (2, 4, 4, 1)
    assert r.all.precision == r.all.recall == r.all.f1 == 50.0


def test_punctuation_is_ignored():
    moved = "(TOP (S (NP (DT The) (NN dog)) (VP (VBZ chews) (NP (NNS bones)) (. .))))"
    dropped = "(TOP (S (NP (DT The) (NN dog)) (VP (VBZ chews) (NP (NNS bones)))))"
    for test in (moved, dropped):
        assert score(GOLD, test).all.f1 == 100.0
    # A bracket that only covers punctuation spans nothing and is not counted.
    extra = "(TOP (S (NP (DT The) (NN dog)) (VP (VBZ chews) (NP (NNS bones))) (X (. .))))"
    assert score(GOLD, extra).all.test == 4


def test_function_tags_and_advp_prt_equivalence():
    gold = "(TOP (S (NP-SBJ-1 (PRP It)) (VP (VBD gave) (PRT (RP up)))))"
    test = "(TOP (S (NP=2 (PRP It)) (VP (VBD gave) (ADVP (RP up)))))"
    assert score(gold, test).all.f1 == 100.0
    unl = EvalbParams.collins()
    unl.labeled = False
    assert score(GOLD, GOLD.replace("(VP", "(ADJP"), params=unl).all.f1 == 100.0


def test_xx_tags_take_gold_tags():
    xx = "(TOP (S (NP (XX The) (XX dog)) (VP (XX chews) (NP (XX bones))) (XX .)))"
    assert retag_xx(GOLD, xx, EvalbParams.collins()) == GOLD
    assert score(GOLD, xx).all.f1 == 100.0
    # Without retagging, "(XX .)" is a word: EVALB calls it a length mismatch (error sentence).
    r = score(GOLD, xx, retag=False)
    assert r.all.error_sentences == 1 and r.all.valid == 0


def test_errors_skips_and_cutoff():
    long_words = " ".join(f"(NN w{i})" for i in range(41))
    gold = [GOLD, GOLD, GOLD, f"(TOP (S (NP {long_words})))"]
    test = [GOLD.replace("(DT The) ", ""),                  # length mismatch -> error
            GOLD.replace("bones", "bone"),                 # word mismatch -> error
            "",                                            # no words -> skipped
            f"(TOP (S (NP {long_words})))"]
    r = evaluate(gold, test)
    assert [s.status for s in r.sentences] == [1, 1, 2, 0]
    a = r.all
    assert (a.sentences, a.error_sentences, a.skip_sentences, a.valid) == (4, 2, 1, 1)
    assert r.short.sentences == 3 and r.short.valid == 0       # the 41-word one is over 40
    assert r.all.f1 == 100.0 and r.short.f1 == 0.0


def test_line_count_mismatch_and_max_error():
    with pytest.raises(NmtError, match="lines"):
        evaluate([GOLD, GOLD], [GOLD])
    bad = GOLD.replace("(DT The) ", "")
    with pytest.raises(NmtError, match="MAX_ERROR"):
        evaluate([GOLD] * 12, [bad] * 12)              # EVALB exits at its 12th error
    assert evaluate([GOLD] * 11, [bad] * 11).all.error_sentences == 11
    with pytest.raises(NmtError, match="EVALB would stop"):
        evaluate([GOLD], ["(TOP (S (NN dog barks)))"])


def test_matches_evalb_output_exactly():
    """The fixture's .out is what `evalb -p COLLINS.prm gold test` printed on these files."""
    gold = read_lines(FIX / "evalb_cases.gold")
    test = read_lines(FIX / "evalb_cases.test")
    r = evaluate(gold, test, retag=False)
    assert format_report(r) == (FIX / "evalb_cases.collins.out").read_text()
    assert len(r.errors) == 6


def test_parameter_file(tmp_path):
    prm = tmp_path / "x.prm"
    prm.write_text("## comment\nDEBUG 0\nMAX_ERROR 3\nCUTOFF_LEN 2\nLABELED 0\n"
                   "DELETE_LABEL TOP\nDELETE_LABEL .\nDELETE_LABEL_FOR_LENGTH -NONE-\n"
                   "EQ_LABEL ADVP PRT\n# EQ_WORD  Example example\n")
    p = EvalbParams.from_file(prm)
    assert (p.max_error, p.cutoff_len, p.labeled) == (3, 2, False)
    assert p.delete_labels == ["TOP", "."] and p.eq_labels == [("ADVP", "PRT")]
    prm.write_text("BOGUS 1\n")
    with pytest.raises(NmtError, match="line 1"):
        EvalbParams.from_file(prm)


# --- against EVALB itself (tests/fixtures/evalb/README.md) ------------------------------------

def nmt_score(gold: Path, test: Path, *args: str):
    """nmt-score's bracket-f1 of ``test`` against ``gold`` (EVALB's rules, no XX retagging)."""
    return CliRunner().invoke(score_main, ["-r", str(gold), "-i", str(test), "-m", "bracket-f1",
                                           "--no-retag", *args])


def error_messages(text: str, pattern: str) -> list[tuple[int, str]]:
    """(line, message) of each per-sentence error EVALB (``N : msg``) or nmt-score
    (``... line N: msg``) wrote on stderr."""
    return [(int(m.group(1)), m.group(2)) for m in re.finditer(pattern, text, re.M)]


EVALB_ERROR = r"^(\d+) : (.*)$"
NMT_ERROR = r"\| WARNING \|.* line (\d+): (.*)$"


@pytest.mark.parametrize("params", ["collins", "unlabeled"])
def test_edge_cases_match_the_pinned_evalb_output(params):
    """Punctuation, unary chains, labels, crossing brackets and lengths around CUTOFF_LEN 40:
    the .out files are what the pinned EVALB printed (README there); nmt-score must print the
    same report and the same per-sentence errors."""
    gold, test = EVALB_FIX / "evalb_edge.gold", EVALB_FIX / "evalb_edge.test"
    args = ["--evalb-params", str(UNLABELED_PRM)] if params == "unlabeled" else []
    r = nmt_score(gold, test, "--evalb-report", *args)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == (EVALB_FIX / f"evalb_edge.{params}.out").read_text()
    assert error_messages(r.stderr, NMT_ERROR) == error_messages(
        (EVALB_FIX / "evalb_edge.err").read_text(), EVALB_ERROR)


@pytest.fixture(scope="module")
def evalb(tmp_path_factory):
    """The pinned EVALB release, compiled here: (the program, its COLLINS.prm)."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc or gcc) to build EVALB")
    src_dir = Path(os.environ.get("NMT_EVALB_DIR") or EVALB_FIX)
    if not (src_dir / "evalb.c").is_file():
        pytest.skip(f"no evalb.c in {src_dir}: put the pinned EVALB release's evalb.c and "
                    f"COLLINS.prm there, or set NMT_EVALB_DIR (tests/fixtures/evalb/README.md)")
    for line in (EVALB_FIX / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        got = hashlib.sha256((src_dir / name).read_bytes()).hexdigest()
        assert got == digest, f"{src_dir / name} is not the pinned EVALB release's {name}"
    build = tmp_path_factory.mktemp("evalb")
    # The one edit every vendored copy makes: <malloc.h> does not exist everywhere (malloc is
    # declared by <stdlib.h>, which evalb.c includes). gnu89: its K&R-style C.
    source = (src_dir / "evalb.c").read_bytes().replace(b"#include <malloc.h>\n", b"")
    (build / "evalb.c").write_bytes(source)
    r = subprocess.run([cc, "-O2", "-std=gnu89", "-w", "-o", str(build / "evalb"),
                        str(build / "evalb.c")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return build / "evalb", src_dir / "COLLINS.prm"


_TAGS = ["NN", "VBZ", "DT", "JJ", "IN", "RB", "RP"]
_PUNCT = [(",", ","), (".", "."), (":", ";"), ("``", "``"), ("''", "''"), ("-LRB-", "-LRB-"),
          ("$", "$")]
_LABELS = ["S", "NP", "VP", "PP", "ADVP", "PRT", "SBAR", "NP-SBJ-1", "PP=2", "X"]


def _tree(rng: random.Random, items: list, depth: int = 0):
    """A random tree (nested lists [label, child...]; leaves (tag, word)) over ``items``,
    with unary chains now and then."""
    kids, i = [], 0
    while i < len(items):
        k = rng.randint(1, min(len(items) - i, 4))
        chunk, i = items[i:i + k], i + k
        kids += [_tree(rng, chunk, depth + 1)] if (k > 1 or rng.random() < 0.3) and depth < 6 \
            else chunk
    node = [rng.choice(_LABELS), *kids]
    while rng.random() < 0.15:
        node = [rng.choice(_LABELS), node]
    return node


def _change(rng: random.Random, node, p: float):
    """``node`` with some labels and tags changed, constituents flattened or added; now and
    then a punctuation tag swapped with a word's (length mismatch) or a word changed."""
    if isinstance(node, tuple):
        tag, word = node
        r = rng.random()
        return (rng.choice(_TAGS) if r < p / 3 and tag in _TAGS else
                rng.choice(["NN", ".", "-NONE-"]) if r < p / 3 + p / 20 else tag,
                word + "x" if rng.random() < p / 40 else word)
    label = rng.choice(_LABELS) if rng.random() < p else node[0]
    kids = []
    for k in (_change(rng, k, p) for k in node[1:]):
        kids += k[1:] if not isinstance(k, tuple) and rng.random() < p / 2 else [k]
    if len(kids) > 2 and rng.random() < p:
        i = rng.randrange(len(kids) - 1)
        kids[i:i + 2] = [[rng.choice(_LABELS), kids[i], kids[i + 1]]]
    return [label, *kids]


def _text(node) -> str:
    if isinstance(node, tuple):
        return f"({node[0]} {node[1]})"
    return f"({node[0]} {' '.join(map(_text, node[1:]))})"


def random_treebank(seed: int, n: int) -> tuple[list[str], list[str]]:
    """``n`` gold trees of 1-45 words (punctuation, -NONE- among them) and a test tree for
    each: another random tree over the same leaves (crossing brackets) or a changed copy."""
    rng = random.Random(seed)
    gold, test = [], []
    for _ in range(n):
        leaves = [rng.choice(_PUNCT) if r < 0.15 else ("-NONE-", "*T*-1") if r < 0.2 else
                  (rng.choice(_TAGS), f"w{i}")
                  for i, r in enumerate(rng.random() for _ in range(rng.choice(
                      [1, 2, 3, 5, 8, 15, 39, 40, 41, 45])))]
        g = _tree(rng, leaves)
        t = _tree(rng, leaves) if rng.random() < 0.3 else _change(rng, g, rng.choice([0, .2, .5]))
        root = rng.choice(["TOP", "", None])
        wrap = (lambda x: x) if root is None else (lambda x: [root, x])
        gold.append(_text(wrap(g)))
        test.append(_text(wrap(t)))
    return gold, test


@pytest.mark.parametrize("params", ["collins", "unlabeled"])
def test_compiled_evalb_and_nmt_agree(evalb, tmp_path, params):
    """The same report, per-sentence errors and F1 from EVALB (``-p COLLINS.prm``, or the
    unlabelled parameters) and nmt-score (its built-in COLLINS settings, or the same file):
    on the fixtures and on 400 random tree pairs."""
    program, collins_prm = evalb
    prm = collins_prm if params == "collins" else UNLABELED_PRM
    nmt_args = [] if params == "collins" else ["--evalb-params", str(prm)]
    gold, test = random_treebank(seed=29, n=400)
    (tmp_path / "random.gold").write_text("".join(x + "\n" for x in gold))
    (tmp_path / "random.test").write_text("".join(x + "\n" for x in test))
    for name, folder in (("evalb_cases", FIX), ("evalb_edge", EVALB_FIX), ("random", tmp_path)):
        g, t = folder / f"{name}.gold", folder / f"{name}.test"
        ref = subprocess.run([str(program), "-p", str(prm), "-e", "1000000", str(g), str(t)],
                             capture_output=True, text=True, timeout=60)
        assert ref.returncode == 0, ref.stderr
        r = nmt_score(g, t, "--evalb-report", "--max-errors", "-1", *nmt_args)
        assert r.exit_code == 0, r.stderr
        assert r.stdout == ref.stdout, name
        assert error_messages(r.stderr, NMT_ERROR) == error_messages(ref.stderr, EVALB_ERROR)
        # The number nmt-score --json (and validation) reports: EVALB's FMeasure, both cuts.
        r = nmt_score(g, t, "--json", "--max-errors", "-1", *nmt_args)
        got = json.loads(r.stdout)
        want = re.findall(r"^Bracketing FMeasure += +(\S+)$", ref.stdout, re.M)
        assert [f"{got['all']['f1']:.2f}", f"{got['len<=40']['f1']:.2f}"] == want, name
    assert "Length unmatch" in ref.stderr and "Words unmatch" in ref.stderr   # errors tried


def test_compiled_evalb_and_nmt_stop_at_the_same_error(evalb, tmp_path):
    program, collins_prm = evalb
    tree = "(TOP (S (NP (DT The) (NN dog)) (VP (VBZ barks))))"
    for n_bad in (11, 12):              # MAX_ERROR 10: EVALB exits at its 12th error
        gold, test = tmp_path / "g", tmp_path / "t"
        gold.write_text((tree + "\n") * (n_bad + 2))
        test.write_text((tree.replace("(DT The) ", "") + "\n") * n_bad + (tree + "\n") * 2)
        ref = subprocess.run([str(program), "-p", str(collins_prm), str(gold), str(test)],
                             capture_output=True, text=True, timeout=60)
        r = nmt_score(gold, test, "--evalb-report")
        if ref.returncode == 0:
            assert r.exit_code == 0 and r.stdout == ref.stdout, r.stderr
        else:
            assert r.exit_code != 0 and f"line {n_bad}:" in r.stderr, r.stderr
            assert len(error_messages(ref.stderr, EVALB_ERROR)) == n_bad
    assert ref.returncode == 1


def test_sentence_scores_leave_out_what_the_corpus_f1_leaves_out(tmp_path):
    """--sentence prints no F1 for an error sentence (NaN; null in JSON), as EVALB gives none
    and the corpus F1 does not count it."""
    gold, test = tmp_path / "gold", tmp_path / "test"
    gold.write_text(GOLD + "\n" + GOLD + "\n")
    test.write_text(GOLD + "\n" + GOLD.replace("(NN dog)", "(NN dog") + "\n")
    r = nmt_score(gold, test, "--sentence")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines() == ["100.0", "nan"]
    r = nmt_score(gold, test, "--sentence", "--json")
    assert [json.loads(x) for x in r.stdout.splitlines()] == [{"bracket-f1": 100.0},
                                                              {"bracket-f1": None}]


def test_evalb_report_takes_one_reference(tmp_path):
    gold = tmp_path / "gold"
    gold.write_text(GOLD + "\n")
    r = CliRunner().invoke(score_main, ["-r", str(gold), "-r", str(gold), "-i", str(gold),
                                        "-m", "bracket-f1", "--evalb-report"])
    assert r.exit_code == 2 and r.stdout == ""
    assert "bracket-f1 takes exactly one reference" in r.stderr


def test_parameter_lines_that_start_with_blanks_are_skipped_as_evalb_does(tmp_path, caplog):
    """EVALB compares each keyword with the start of the raw line: an indented line is an
    "Unknown keyword" to it and sets nothing (the pinned evalb.c, compiled: 93.33 where
    applying the indented DELETE_LABEL gave 90.91). A parameter file's MAX_ERROR -1 stops at
    the first error, as there (Error_count++ > -1); only --max-errors -1 means never."""
    prm = tmp_path / "p.prm"
    prm.write_text("LABELED 1\n  DELETE_LABEL TOP\n\tCUTOFF_LEN 30\n   # a comment\n"
                   "MAX_ERROR -1\n")
    with caplog.at_level("WARNING", logger="nmt.metrics"):
        p = EvalbParams.from_file(prm)
    assert p.delete_labels == [] and p.cutoff_len == 40 and p.labeled and p.max_error == -1
    assert "line 2 starts with a blank" in caplog.text and "line 3" in caplog.text
    bad = GOLD.replace("(DT The) ", "")
    with pytest.raises(NmtError, match="MAX_ERROR -1"):
        evaluate([GOLD], [bad], params=p)
    p.max_error = None                                 # --max-errors -1
    assert evaluate([GOLD] * 20, [bad] * 20, params=p).all.error_sentences == 20
