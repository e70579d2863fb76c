"""nmt-score -m multi-bleu: the Multi30k literature's BLEU (lowercased, punctuation-normalized,
Moses-tokenized text scored with multi-bleu.perl's rules).

The reference computations here are independent of nmt's BLEU code: a score worked out by
hand from n-gram counts, and sacreBLEU's own BLEU with no tokenization and no smoothing (which
multi-bleu.perl's arithmetic equals for one reference) on the prepared lines.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import sacrebleu

from nmt.metrics.tok_bleu import literature_bleu, literature_prepare

# Lines of the kind Multi30k holds, with quotes, an ampersand, a hyphenated compound, dashes.
REFS = ["Eine Frau auf einem Boot namens \"El Corazon\" lässt Gewichte ins Wasser fallen.",
        "Leute gehen an einem Lounge & Grill die Straße entlang.",
        "Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun.",
        "Er sagt: „Hallo“ – und geht…",
        "Zwei Männer spielen Fußball auf einer Wiese."]
HYPS = ["Eine Frau in einem Boot namens „El Corazon“ lässt Gewichte ins Wasser.",
        "Menschen gehen an einem Lounge & Grill die Straße entlang.",
        "Ein Boston Terrier rennt über das saftig-grüne Gras vor einem weißen Zaun.",
        "er sagt: \"Hallo\" - und geht ...",
        "Zwei Männer spielen Fussball auf einer Wiese."]


def test_lines_are_prepared_as_task1_tokenize_sh():
    # lowercase.perl | normalize-punctuation.perl -l de | tokenizer.perl -l de
    assert literature_prepare(REFS[0], "de", True) == (
        "eine frau auf einem boot namens &quot; el corazon &quot; lässt gewichte ins wasser "
        "fallen .")
    assert literature_prepare(REFS[1], "de", True) == (
        "leute gehen an einem lounge &amp; grill die straße entlang .")
    assert literature_prepare(REFS[2], "de", False) == (
        "Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun .")
    assert literature_prepare(REFS[3], "de", True) == "er sagt : &quot; hallo &quot; - und geht ..."


def test_score_worked_out_by_hand():
    # p1 5/6, p2 3/5, p3 2/4, p4 1/3, equal lengths: BLEU = (1/12) ** (1/4)
    r = literature_bleu(["the cat sat on the mat"], [["the cat sat on a mat"]], "en", False)
    assert r.correct == [5, 3, 2, 1] and r.total == [6, 5, 4, 3]
    assert r.score == pytest.approx(100 * (1 / 12) ** 0.25, abs=1e-9)
    # a hypothesis shorter than its reference: the brevity penalty exp(1 - 7/6)
    r = literature_bleu(["the cat sat on the mat"], [["the cat sat on a red mat"]], "en", False)
    assert r.bp == pytest.approx(math.exp(1 - 7 / 6))


@pytest.mark.parametrize("lowercase", [True, False])
def test_equals_sacrebleu_without_tokenization_or_smoothing(lowercase):
    ours = literature_bleu(HYPS, [REFS], "de", lowercase)
    h = [literature_prepare(x, "de", lowercase) for x in HYPS]
    r = [literature_prepare(x, "de", lowercase) for x in REFS]
    ref = sacrebleu.corpus_bleu(h, [r], tokenize="none", smooth_method="none", force=True)
    assert ours.score == pytest.approx(ref.score, abs=1e-9)
    assert (ours.hyp_len, ours.ref_len) == (ref.sys_len, ref.ref_len)
    assert ours.score > 0


def test_cli_lowercase_and_json(tmp_path):
    hyp, ref = tmp_path / "hyp.de", tmp_path / "ref.de"
    hyp.write_text("\n".join(HYPS) + "\n", encoding="utf-8")
    ref.write_text("\n".join(REFS) + "\n", encoding="utf-8")

    def score(*extra):
        p = subprocess.run([sys.executable, "-m", "nmt.cli.score", "--ref", str(ref), "--hyp",
                            str(hyp), "-m", "multi-bleu", "--lang", "de", "--json", *extra],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    lc, cased = score("--lowercase"), score()
    assert lc["signature"].startswith("tok:moses-de|norm:moses-punct|case:lc|smooth:none")
    assert "case:mixed" in cased["signature"]
    assert lc["score_exact"] == pytest.approx(literature_bleu(HYPS, [REFS], "de", True).score)
    # "er sagt" against "Er sagt" only matches when lowercased
    assert lc["score_exact"] > cased["score_exact"]
    p = subprocess.run([sys.executable, "-m", "nmt.cli.score", "--ref", str(ref), "--hyp",
                        str(hyp), "-m", "multi-bleu"], capture_output=True, text=True)
    assert p.returncode == 2 and "--metric multi-bleu needs --lang" in p.stderr
