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


def test_quotes_as_the_release_s_moses_snapshot_normalizes_them():
    """The Multi30k release ran normalize-punctuation.perl of Moses 3a0631a: a period before a
    closing quote at the end of a line moves after it (the script sees the newline), and
    single curly quotes not between two ASCII letters become " (later Moses keeps them '). The
    expected lines are the release's own (data/task1/tok/*.lc.norm.tok.*), from which these
    raw lines come; benchmarks/check_literature_tokenization.py compares all 96,042 lines of
    train, val and test_2016_flickr in en, de and fr (none differ)."""
    assert literature_prepare(
        'Ein Mann hält ein Schild: "come on now... what\'s gayer than tea."', "de", True) == (
        "ein mann hält ein schild : &quot; come on now ... what &apos; s gayer than tea "
        "&quot; .")
    assert literature_prepare("Une femme jette un coup d’œil dans un télescope.", "fr",
                              True) == ("une femme jette un coup d &quot; œil dans un "
                                        "télescope .")
    assert literature_prepare("Das „hook ’em horns“-Zeichen.", "de", True) == (
        "das &quot; hook &quot; em horns &quot; -zeichen .")
    # between two ASCII letters it is an apostrophe; a period inside the line stays put
    assert literature_prepare("It’s \"fine.\" Yes.", "de", True) == (
        "it &apos; s &quot; fine &quot; . yes .")


def test_pretokenized_files_are_scored_as_they_are(tmp_path):
    """-m multi-bleu --pretokenized scores prepared text (the release's tokenized references, a
    model's output on them) only lowercased: preparing it again escaped its escapes."""
    prepared = [literature_prepare(x, "de", True) for x in REFS]
    hyps = [literature_prepare(x, "de", True) for x in HYPS]
    assert literature_prepare(prepared[0], "de", True) != prepared[0]      # &amp; quot ;
    direct = literature_bleu(hyps, [prepared], "de", True, tokenize=False)
    assert direct.score == pytest.approx(literature_bleu(HYPS, [REFS], "de", True).score)
    hyp, ref = tmp_path / "hyp.tok", tmp_path / "ref.tok"
    hyp.write_text("".join(x + "\n" for x in hyps), encoding="utf-8")
    ref.write_text("".join(x + "\n" for x in prepared), encoding="utf-8")
    p = subprocess.run([sys.executable, "-m", "nmt.cli.score", "--ref", str(ref), "--hyp",
                        str(hyp), "-m", "multi-bleu", "--lang", "de", "--pretokenized",
                        "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["signature"].startswith("tok:none|norm:none|case:mixed")
    assert out["score_exact"] == pytest.approx(direct.score)


@pytest.mark.parametrize("lang,message", [
    ("FR", "--lang takes a lowercase ISO 639 language code, got 'FR' (did you mean --lang fr?)"),
    ("fr_FR", "got 'fr_FR' (did you mean --lang fr?)"),
    ("en-US", "got 'en-US' (did you mean --lang en?)"),
    ("pt-BR", "got 'pt-BR' (did you mean --lang pt?)"),
])
def test_lang_is_a_lowercase_code(tmp_path, lang, message):
    """Moses keys its rules by lowercase codes: --lang FR got generic rules without a word
    (no French contraction splitting)."""
    f = tmp_path / "x.fr"
    f.write_text("L'homme.\n", encoding="utf-8")
    p = subprocess.run([sys.executable, "-m", "nmt.cli.score", "--ref", str(f), "--hyp",
                        str(f), "-m", "multi-bleu", "--lang", lang], capture_output=True,
                       text=True)
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert p.stderr.count("\n") == 1
    p = subprocess.run([sys.executable, "-m", "nmt.cli.score", "--ref", str(f), "--hyp",
                        str(f), "-m", "multi-bleu", "--lang", "xx"], capture_output=True,
                       text=True)
    assert p.returncode == 0 and "--lang xx: Moses has no rules of its own" in p.stderr
