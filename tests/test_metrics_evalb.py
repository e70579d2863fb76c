"""Bracket scores against hand-computed cases and against EVALB's own output (COLLINS.prm)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nmt.errors import NmtError
from nmt.metrics.evalb import EvalbParams, evaluate, format_report, retag_xx
from nmt.io import read_lines

FIX = Path(__file__).resolve().parent / "fixtures" / "parsing"

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
