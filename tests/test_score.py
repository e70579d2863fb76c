"""nmt-score: equality with sacreBLEU's command line, the paper's tokenized BLEU, bad input."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from nmt.cli.score import main
from nmt.metrics.tok_bleu import multi_bleu, prepare, split_compounds, tok_bleu

FIX = Path(__file__).resolve().parent / "fixtures" / "parsing"
VOCAB = ("the a cat dog sat on mat . , ! ? well-known x-y-z State-of-the-art 1,000 $5 "
         "Über naïve \"quoted\" it's (paren) 3.14 U.S. e-mail").split()


def make_corpus(tmp_path: Path, n: int = 40, nrefs: int = 2, seed: int = 0):
    rng = random.Random(seed)

    def sent(k):
        return " ".join(rng.choice(VOCAB) for _ in range(k))

    refs = [[sent(rng.randint(3, 15)) for _ in range(n)] for _ in range(nrefs)]
    # Hypotheses share words with the first reference so that scores are not all zero.
    hyps = [" ".join(w for w in r.split() if rng.random() < 0.8) + " " + sent(rng.randint(0, 2))
            for r in refs[0]]
    hyps[3] = hyps[3] + "   "                      # trailing spaces: sacreBLEU strips them
    paths = []
    for k, r in enumerate(refs):
        p = tmp_path / f"ref{k}.txt"
        p.write_text("".join(x + "\n" for x in r), encoding="utf-8")
        paths.append(p)
    h = tmp_path / "hyp.txt"
    h.write_text("".join(x + "\n" for x in hyps), encoding="utf-8")
    return h, paths


def sacrebleu_cli(*args) -> str:
    r = subprocess.run([sys.executable, "-m", "sacrebleu", *map(str, args)],
                       capture_output=True, text=True, check=True)
    return r.stdout


def run(args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


@pytest.mark.parametrize("opts", [[], ["--tokenize", "intl", "--lowercase"]])
def test_equals_sacrebleu_cli(tmp_path, opts):
    hyp, refs = make_corpus(tmp_path)
    for nref in (1, 2):
        ours = run(["--hyp", hyp, *sum([["--ref", r] for r in refs[:nref]], []),
                    "--metric", "bleu,chrf", "--metric", "ter", *opts])
        assert ours.exit_code == 0, ours.output
        theirs = {}
        for m in ("bleu", "chrf", "ter"):
            extra = opts if m == "bleu" else []
            if m == "chrf" and "--lowercase" in opts:      # nmt-score's -lc covers chrF too
                extra = ["--chrf-lowercase"]
            theirs[m] = sacrebleu_cli(*refs[:nref], "-i", hyp, "-m", m, "-f", "text",
                                      *extra).strip()
        assert ours.stdout.splitlines() == [theirs["bleu"], theirs["chrf"], theirs["ter"]]


def test_json_and_sentence_level_equal_sacrebleu(tmp_path):
    hyp, refs = make_corpus(tmp_path, seed=1)
    ours = json.loads(run(["-i", hyp, "-r", refs[0], "-m", "bleu,chrf", "--json"]).stdout)
    theirs = json.loads(sacrebleu_cli(refs[0], "-i", hyp, "-m", "bleu", "chrf"))
    for o, t in zip(ours, theirs):
        assert (o["name"], o["score"], o["signature"]) == (t["name"], t["score"], t["signature"])
        assert round(o["score_exact"], 1) == t["score"]
    for m in ("bleu", "chrf", "ter"):
        ours = run(["-i", hyp, "-r", refs[0], "-m", m, "--sentence", "-w", "3"])
        assert ours.exit_code == 0
        theirs = sacrebleu_cli(refs[0], "-i", hyp, "-m", m, "-sl", "-b", "-w", "3")
        assert ours.stdout.splitlines() == theirs.splitlines()


def test_stdin_and_several_metrics_sentence_json(tmp_path):
    hyp, refs = make_corpus(tmp_path, n=5, nrefs=1)
    r = run(["-r", refs[0], "-m", "bleu,tok-bleu", "--sentence", "--json", "--lang", "en"],
            input=hyp.read_text())
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in r.stdout.splitlines()]
    assert len(rows) == 5 and set(rows[0]) == {"bleu", "tok-bleu"}


def test_compound_split_is_sed_like():
    # sed's g flag does not rescan consumed text: the 'b' of 'a-b' cannot start another match.
    assert split_compounds("a-b-c") == "a ##AT##-##AT## b-c"
    assert split_compounds("state-of-the-art") == \
        "state ##AT##-##AT## of ##AT##-##AT## the ##AT##-##AT## art"
    assert split_compounds("- x- -y 1-2") == "- x- -y 1 ##AT##-##AT## 2"
    # perl's \S (of bytes): a tab or another ASCII blank is no part of a compound
    assert split_compounds("a-\tb c\f-d é-ß") == "a-\tb c\f-d é ##AT##-##AT## ß"


def test_tok_bleu_hand_checked():
    hyp = ["Das ist ein gut-gemachtes Haus."]
    ref = ["Das ist ein gut-gemachtes, großes Haus."]
    # Moses (de) + compound split:
    assert prepare(hyp[0], "de") == "Das ist ein gut ##AT##-##AT## gemachtes Haus ."
    assert prepare(ref[0], "de") == "Das ist ein gut ##AT##-##AT## gemachtes , großes Haus ."
    # hyp 8 tokens, ref 10. Matching n-grams: 1-grams 8/8; 2-grams 6/7 (all but 'gemachtes
    # Haus'); 3-grams 4/6 (not '##AT##-##AT## gemachtes Haus', 'gemachtes Haus .'); 4-grams 3/5.
    # BP = exp(1 - 10/8).
    r = tok_bleu(hyp, [ref], lang="de")
    assert (r.correct, r.total, r.hyp_len, r.ref_len) == ([8, 6, 4, 3], [8, 7, 6, 5], 8, 10)
    expected = math.exp(1 - 10 / 8) * (1 * 6 / 7 * 4 / 6 * 3 / 5) ** 0.25 * 100
    assert r.score == pytest.approx(expected)
    assert f"{r.score:.2f}" == "59.59"          # what multi-bleu.perl prints for these tokens
    assert r.format() == (f"{expected:.2f}, 100.0/85.7/66.7/60.0 "
                          f"(BP=0.779, ratio=0.800, hyp_len=8, ref_len=10)")


def test_multi_bleu_rules():
    # Closest reference length (the shorter one on ties), clipping by the max count over refs.
    r = multi_bleu(["a a a b"], [["a b c"], ["a a x y z"]])
    assert r.ref_len == 3 and r.correct[0] == 3          # 'a' clipped at 2, plus 'b'
    # A zero precision gives 0 without smoothing; empty hypotheses give 0.
    assert multi_bleu(["a b c"], [["a b d e"]]).score == 0.0
    assert multi_bleu([""], [["a"]]).score == 0.0


def test_tok_bleu_cli(tmp_path):
    (tmp_path / "h").write_text("Das ist ein gut-gemachtes Haus.\n", encoding="utf-8")
    (tmp_path / "r").write_text("Das ist ein gut-gemachtes, großes Haus.\n", encoding="utf-8")
    r = run(["-i", tmp_path / "h", "-r", tmp_path / "r", "-m", "tok-bleu", "--lang", "de"])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("tok-BLEU|tok:moses-de|split:compound|")
    assert "(BP=0.779, ratio=0.800, hyp_len=8, ref_len=10)" in r.stdout


def test_tok_bleu_normalizes_quotes_on_both_sides(tmp_path):
    # The model writes ASCII quotes (its training text was punctuation-normalized); the raw
    # newstest2014 reference keeps German quotes. tok-bleu maps both sides to ASCII by default.
    (tmp_path / "h").write_text('"Hallo", sagte er, \'ja\' und Peter\'s Haus.\n', encoding="utf-8")
    (tmp_path / "r").write_text("„Hallo“, sagte er, ‚ja‘ und Peter’s Haus.\n", encoding="utf-8")
    args = ["-i", tmp_path / "h", "-r", tmp_path / "r", "-m", "tok-bleu", "--lang", "de", "--json"]
    on = run(args)
    assert on.exit_code == 0, on.output
    on = json.loads(on.stdout)
    assert on["score"] == 100.0 and "|quotes:ascii|" in on["signature"]
    off = run([*args, "--no-normalize-quotes"])
    assert off.exit_code == 0, off.output
    off = json.loads(off.stdout)
    assert off["score"] < 100.0 and "|quotes:raw|" in off["signature"]
    # The flag lasts for one invocation only, and sentence scores follow it too.
    assert json.loads(run(args).stdout)["score"] == 100.0
    sent = run([*args, "--sentence", "--no-normalize-quotes"])
    assert sent.exit_code == 0 and json.loads(sent.stdout.splitlines()[0])["tok-bleu"] < 100
    # Library: the same mapping, before tokenization (so the quotes are split and escaped as
    # ASCII ones), and to tokenizer.perl's escapes for already tokenized text.
    assert prepare("„Hallo“", "de") == prepare('"Hallo"', "de") == "&quot; Hallo &quot;"
    assert prepare("l’homme « oui »", "fr") == prepare("l'homme \"oui\"", "fr")
    assert prepare("„ Hallo “ it’s", tokenize=False) == prepare('" Hallo " it\'s', tokenize=False) \
        == prepare("&quot; Hallo &quot; it&apos;s", tokenize=False) \
        == "&quot; Hallo &quot; it&apos;s"
    assert prepare("„x“", "de", normalize_quotes=False) == "„ x “"
    assert tok_bleu(['"Hallo", sagte er.'], [["„Hallo“, sagte er."]], "de",
                    normalize_quotes=False).score < 100
    # The double prime is not a quotation mark.
    assert prepare("5″", "de") == prepare("5″", "de", normalize_quotes=False) == "5 ″"


def test_bracket_f1_cli(tmp_path):
    gold, test = FIX / "evalb_cases.gold", FIX / "evalb_cases.test"
    r = run(["-i", test, "-r", gold, "-m", "bracket-f1", "--json", "--no-retag"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["score"] == 61.36 and d["len<=40"]["f1"] == pytest.approx(91.3793, abs=1e-4)
    r = run(["-i", test, "-r", gold, "-m", "bracket-f1", "--evalb-report", "--no-retag"])
    assert r.stdout == (FIX / "evalb_cases.collins.out").read_text()


def cli(*args, input=None):
    return subprocess.run(["nmt-score", *map(str, args)], capture_output=True, input=input)


def test_bad_input(tmp_path):
    good = tmp_path / "good"
    good.write_text("a b c\nd e f\n")
    short = tmp_path / "short"
    short.write_text("a b c\n")
    bad = tmp_path / "bad"
    bad.write_bytes(b"ok\n\xff\xfe\n")
    empty = tmp_path / "empty"
    empty.write_text("")
    cases = [
        (["-r", good, "-i", short], "has 1 lines but"),
        (["-r", good, "-i", tmp_path / "missing"], "no such file"),
        (["-r", bad, "-i", good], "line 2: invalid UTF-8"),
        (["-r", good, "-i", empty], "empty hypothesis file"),
        (["-r", empty, "-i", good], "empty reference file"),
        (["-r", good, "-i", good, "-m", "bleu,blue"], "did you mean 'bleu'"),
        (["-r", good, "-r", good, "-i", good, "-m", "bracket-f1"], "exactly one reference"),
        (["-r", good, "-i", good, "-m", "bracket-f1"], "unreadable tree"),
        (["-r", good, "-i", good, "-m", "tok-bleu", "-l", "en-de"],
         "--lang is the target language alone, not a pair (sacreBLEU's -l takes a pair): "
         "--lang de"),
        (["-r", good, "-i", good, "-m", "bracket-f1", "--evalb-report", "--json"],
         "leave out --json"),
        (["-r", good, "-i", good, "-m", "bracket-f1", "--evalb-report", "--sentence"],
         "leave out --sentence"),
    ]
    for args, msg in cases:
        r = cli(*args)
        err = r.stderr.decode()
        assert r.returncode != 0, args
        assert msg in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    r = cli("-r", good, input=b"a b c\n")          # stdin with too few lines
    assert r.returncode == 1 and b"<stdin> has 1 lines but" in r.stderr


def test_the_metric_table_is_what_nmt_score_computes():
    """Each metric the table (nmt.metrics.table) gives nmt-score is computed under its own name
    and scores in the direction the table says, the one checkpoint selection follows."""
    from nmt.metrics.scoring import corpus_score
    from nmt.metrics.table import BY_NAME, SCORE_METRICS

    refs = ["the cat sat on the mat .", "a dog ran in the big park today ."]
    bad = ["mat the on sat .", "park dog today a ran in"]
    trees = ["(S (NP (D the) (N cat)) (VP (V sat) (PP (P on) (NP (D the) (N mat)))))",
             "(S (NP (D a) (N dog)) (VP (V ran)))"]
    bad_trees = ["(S (D the) (NP (N cat) (V sat) (P on)) (VP (D the) (N mat)))",
                 "(S (D a) (VP (N dog) (V ran)))"]
    for name in SCORE_METRICS:
        r, b = (trees, bad_trees) if name == "bracket-f1" else (refs, bad)
        good_score, bad_score = corpus_score(name, r, [r]), corpus_score(name, b, [r])
        assert good_score.metric == bad_score.metric == name
        assert (good_score.score > bad_score.score) == BY_NAME[name].higher_is_better, name
        assert good_score.score != bad_score.score, name


def test_options_are_the_score_config_and_ref_is_required(tmp_path):
    """nmt-score's options are ScoreConfig's fields (declared once, with option()); --ref, a
    repeatable option without a default, is still required."""
    import dataclasses

    from nmt.cli.score import ScoreConfig

    assert ({p.name for p in main.params} - {"verbose", "quiet"}
            == {f.name for f in dataclasses.fields(ScoreConfig)})
    hyp = tmp_path / "hyp"
    hyp.write_text("the cat sat on the mat\n")
    r = cli("-i", hyp)
    assert r.returncode == 2 and r.stdout == b""
    assert r.stderr.decode().splitlines() == [
        "nmt-score: error: Missing option '--ref' / '--reference' / '-r'."]
    r = cli("-i", hyp, "-r", hyp, "-r", hyp, "-m", "bleu", "--json", "-w", "2")
    assert r.returncode == 0 and json.loads(r.stdout)["score"] == 100.0


def test_references_and_hypotheses_cannot_both_come_from_stdin(tmp_path):
    from click.testing import CliRunner

    from nmt.cli.score import main

    r = CliRunner().invoke(main, ["--ref", "-"], input="a b\n")
    assert r.exit_code == 2 and r.stdout == ""
    assert "--ref - and the hypotheses would both be read from stdin" in r.stderr


def test_a_bom_is_dropped_with_a_warning(tmp_path):
    """A reference saved with a byte-order mark scores as without it (the first word
    matches), and nmt-score says it dropped the mark, since sacreBLEU's own command line
    keeps it (and scores that line lower)."""
    hyp, ref = tmp_path / "hyp", tmp_path / "ref"
    hyp.write_text("the cat sat on the mat .\n", encoding="utf-8")
    ref.write_text("the cat sat on the mat .\n", encoding="utf-8-sig")
    r = cli("-r", ref, "-i", hyp, "-m", "bleu", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["score"] == 100.0
    assert f"{ref}: dropped the UTF-8 byte-order mark" in r.stderr.decode()


def test_jsonl_hypotheses_are_warned_about(tmp_path):
    """nmt-generate's jsonl output given as --hyp was scored as text (BLEU near 0) without a
    word; it is still scored as given, with a warning that says what to do."""
    ref = tmp_path / "ref.txt"
    ref.write_text("ein Hund läuft\n")
    hyp = tmp_path / "hyp.jsonl"
    hyp.write_text(json.dumps({"id": 0, "translation": "ein Hund läuft"}) + "\n")
    r = subprocess.run([sys.executable, "-m", "nmt.cli.score", "--ref", str(ref), "--hyp",
                        str(hyp), "-m", "bleu"], capture_output=True, text=True)
    assert r.returncode == 0 and "jsonl output" in r.stderr
    plain = tmp_path / "hyp.txt"
    plain.write_text("ein Hund läuft\n")
    r = subprocess.run([sys.executable, "-m", "nmt.cli.score", "--ref", str(ref), "--hyp",
                        str(plain), "-m", "bleu"], capture_output=True, text=True)
    assert r.returncode == 0 and "jsonl" not in r.stderr
