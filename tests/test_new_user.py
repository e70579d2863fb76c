"""What a new user hits, each through the real command: rerunnable preprocessing,
pipelines whose first command failed, one-line usage errors with suggestions, --split with a
checkpoint, tok-bleu without --lang, the warm-up warning, readable captured logs."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from click.testing import CliRunner

from nmt.cli.generate import main as generate_main
from nmt.cli.preprocess import main as preprocess_main
from nmt.cli.score import main as score_main
from nmt.cli.train import main as train_main
from nmt.search.translator import Translator
from test_translator import make_checkpoint


def run(args, stdin=None):
    """The installed console script, as a user runs it (stderr captured: not a terminal)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("COLUMNS", None)
    return subprocess.run([str(a) for a in args], input=stdin, capture_output=True, text=True,
                          env=env, timeout=120)


def invoke(command, args, stdin=None):
    r = CliRunner().invoke(command, [str(a) for a in args], input=stdin)
    return r.exit_code, r.stdout, r.stderr


def one_line(err: str, prog: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    return lines[0]


def corpus(tmp_path):
    words = [f"w{i}" for i in range(10)]
    for split, n in (("train", 30), ("test", 4)):
        src = [" ".join(words[(i + j) % 10] for j in range(1 + i % 4)) for i in range(n)]
        for lang, lines in (("xx", src), ("yy", [" ".join(s.split()[::-1]) for s in src])):
            (tmp_path / f"{split}.{lang}").write_text("\n".join(lines) + "\n")
    return ["-s", "xx", "-t", "yy", "--trainpref", tmp_path / "train", "--testpref",
            tmp_path / "test", "--subword", "none", "--joined-dictionary", "--workers", "1",
            "--destdir", tmp_path / "bin"]


def test_preprocess_reruns_as_a_no_op_and_refuses_another_build(tmp_path):
    args = corpus(tmp_path)
    code, out, err = invoke(preprocess_main, args)
    assert code == 0, err
    meta = tmp_path / "bin" / "meta.json"
    built = meta.read_bytes()
    # The same command again: the path, exit 0, nothing rebuilt.
    code, out2, err = invoke(preprocess_main, args)
    assert code == 0 and out2 == out and "already built from the same inputs" in err
    assert meta.read_bytes() == built
    # Changed input or options: the old error, saying what differs.
    code, _, err = invoke(preprocess_main, [*args, "--threshold", "2"])
    assert code == 1 and "options --threshold differ" in one_line(err, "nmt-preprocess")
    (tmp_path / "train.yy").write_text((tmp_path / "train.yy").read_text() + "w1\n")
    (tmp_path / "train.xx").write_text((tmp_path / "train.xx").read_text() + "w1\n")
    code, _, err = invoke(preprocess_main, args)
    assert code == 1 and "input train.xx, train.yy changed" in one_line(err, "nmt-preprocess")
    code, _, err = invoke(preprocess_main, [*args, "--overwrite"])
    assert code == 0 and json.loads(meta.read_text())["splits"]["train"]["sentences"] == 31


def test_a_pipeline_after_a_failed_command_says_so_once(tmp_path):
    for prog, args in (("nmt-train", ["--max-update", "1"]), ("nmt-generate", []),
                       ("nmt-score", ["--ref", tmp_path / "ref"])):
        (tmp_path / "ref").write_text("a\n")
        r = run([prog, *args], stdin="")
        assert r.returncode == 1 and r.stdout == ""
        assert "the command before this one printed nothing" in one_line(r.stderr, prog)


def test_text_on_stdin_without_a_checkpoint_is_explained():
    r = run(["nmt-generate"], stdin="A man rides a bike.\n")
    line = one_line(r.stderr, "nmt-generate")
    assert r.returncode == 2 and "first line of stdin was taken as a checkpoint path" in line
    assert "'A man rides a bike.'" in line and "nmt-generate CKPT < input" in line


@pytest.mark.parametrize("prog,flag,suggestion", [
    ("nmt-preprocess", "--train-pref", "--trainpref"),
    ("nmt-train", "--warmpu", "--warmup"),
    ("nmt-generate", "--beem", "--beam"),
    ("nmt-score", "--hypp", "--hyp"),
])
def test_a_wrong_flag_is_one_line_with_a_suggestion(prog, flag, suggestion):
    r = run([prog, flag, "1"])
    assert r.returncode == 2 and r.stdout == ""
    assert one_line(r.stderr, prog) == (f"{prog}: error: no such option {flag} "
                                        f"(did you mean {suggestion}?)")


def test_other_usage_errors_are_one_line():
    code, _, err = invoke(generate_main, ["--beam", "many", "x.pt"])
    assert code == 2 and "'many' is not a valid integer" in one_line(err, "nmt-generate")
    code, _, err = invoke(score_main, ["--hyp", "x"])
    assert code == 2 and "Missing option '--ref'" in one_line(err, "nmt-score")


def test_a_file_given_as_a_prefix_gets_a_hint(tmp_path):
    args = corpus(tmp_path)
    args[args.index(tmp_path / "train")] = tmp_path / "train.xx"
    code, _, err = invoke(preprocess_main, args)
    line = one_line(err, "nmt-preprocess")
    assert code == 2 and "--trainpref takes a file prefix, not a file" in line
    assert f"give --trainpref {tmp_path / 'train'}" in line


def test_bracket_f1_names_the_file_that_is_not_trees(tmp_path):
    (tmp_path / "gold").write_text("(S (NP (DT a) (NN b)) (VP (VBZ c)))\n")
    (tmp_path / "text").write_text("a b c\n")
    for ref, hyp in (("gold", "text"), ("text", "gold")):
        code, _, err = invoke(score_main, ["-r", tmp_path / ref, "--hyp", tmp_path / hyp,
                                           "-m", "bracket-f1"])
        assert code == 1
        assert f"{tmp_path / 'text'}: line 1: unreadable tree" in one_line(err, "nmt-score")


def test_tok_bleu_needs_lang(tmp_path):
    (tmp_path / "r").write_text("Ein Haus.\n")
    code, out, err = invoke(score_main, ["-r", tmp_path / "r", "--hyp", tmp_path / "r",
                                         "-m", "tok-bleu"])
    assert code == 2 and out == "" and "needs --lang" in one_line(err, "nmt-score")
    code, out, err = invoke(score_main, ["-r", tmp_path / "r", "--hyp", tmp_path / "r",
                                         "-m", "tok-bleu", "--lang", "de"])
    assert code == 0 and "tok:moses-de" in out, out


def test_a_text_file_is_not_a_checkpoint(tmp_path):
    (tmp_path / "notes.pt").write_text("hello\n")
    code, _, err = invoke(generate_main, [tmp_path / "notes.pt"], stdin="w1\n")
    line = one_line(err, "nmt-generate")
    assert code == 1 and "not a checkpoint (a text file" in line and "refused" not in line


def test_translate_accepts_one_string(tmp_path):
    t = Translator.from_checkpoint(make_checkpoint(tmp_path / "c.pt"))
    one = t.translate("w1 w2 w3")
    assert isinstance(one, str) and one == t.translate(["w1 w2 w3"])[0]
    with pytest.raises(TypeError, match="list of sentences"):
        t.translate_results("w1 w2 w3")
    with pytest.raises(TypeError, match="sentence 1 is int"):
        t.translate(["w1", 3])


def test_split_with_a_checkpoint_translates_that_split(tmp_path):
    code, out, err = invoke(preprocess_main, corpus(tmp_path))
    assert code == 0, err
    from nmt.data import DataDir

    data = DataDir.open(out.strip())
    ckpt = make_checkpoint(tmp_path / "c.pt", codec=data.src_codec, data_dir=out.strip())
    want = Translator.from_checkpoint(ckpt).translate(
        (tmp_path / "test.xx").read_text().splitlines())
    code, got, err = invoke(generate_main, ["-q", ckpt, "--split", "test"], stdin="")
    assert code == 0, err
    assert got.splitlines() == want
    code, _, err = invoke(generate_main, [ckpt, "--split", "test", "-i", tmp_path / "test.xx"])
    assert code == 2 and "exclude each other" in one_line(err, "nmt-generate")
    code, _, err = invoke(generate_main, ["-q", ckpt, "--split", "valid"])
    assert code == 1 and "valid" in one_line(err, "nmt-generate")


def test_fp16_on_a_cpu_is_the_same_usage_error_everywhere(tmp_path):
    ckpt = make_checkpoint(tmp_path / "c.pt")
    code_g, _, err_g = invoke(generate_main, [ckpt, "--precision", "fp16", "--device", "cpu"],
                              stdin="w1\n")
    code_t, _, err_t = invoke(train_main, [tmp_path, "--max-update", "1", "--precision", "fp16",
                                           "--device", "cpu"])
    assert code_g == code_t == 2
    assert "fp16" in one_line(err_g, "nmt-generate") and "fp16" in one_line(err_t, "nmt-train")


def test_short_run_warns_about_its_warmup(tmp_path):
    code, out, err = invoke(preprocess_main, corpus(tmp_path))
    assert code == 0, err
    code, _, err = invoke(train_main, [out.strip(), "--arch", "transformer_tiny", "--max-update",
                                       "2", "--max-tokens", "100", "--save-dir", tmp_path / "s"])
    assert code == 0, err
    assert "--max-update 2 ends the run before its warm-up of 4000 updates" in err
    code, _, err = invoke(train_main, [out.strip(), "--arch", "transformer_tiny", "--max-update",
                                       "2", "--warmup", "2", "--max-tokens", "100",
                                       "--save-dir", tmp_path / "s2"])
    assert code == 0 and "warm-up" not in err


def test_lr_period_warns_when_cycle_ends_are_not_saved(tmp_path):
    code, out, err = invoke(preprocess_main, corpus(tmp_path))
    assert code == 0, err
    base = [out.strip(), "--arch", "transformer_tiny", "--max-update", "2", "--warmup", "2",
            "--max-tokens", "100"]
    code, _, err = invoke(train_main, base + ["--lr-period", "3", "--save-interval-updates", "2",
                                              "--save-dir", tmp_path / "s"])
    assert code == 0, err
    assert "--lr-period 3: not every cycle's end (updates 5, 8, ...) is saved" in err
    code, _, err = invoke(train_main, base + ["--lr-period", "4", "--save-interval-updates", "2",
                                              "--save-dir", tmp_path / "s2"])
    assert code == 0 and "--lr-period" not in err, err


def test_valid_search_options_without_decoding_validation_are_warned(tmp_path):
    """--valid-beam (any --valid-<search> option) does nothing when validation only computes
    the loss: said once at the start; not said when validation decodes."""
    code, out, err = invoke(preprocess_main, corpus(tmp_path))
    assert code == 0, err
    base = [out.strip(), "--arch", "transformer_tiny", "--max-update", "1", "--warmup", "1",
            "--max-tokens", "100", "--valid-beam", "2", "--valid-max-len-b", "5"]
    code, _, err = invoke(train_main, base + ["--save-dir", tmp_path / "s"])
    assert code == 0, err
    assert ("--valid-beam --valid-max-len-b: validation does not decode in this run, so have "
            "no effect") in err, err
    code, _, err = invoke(train_main, base + ["--valid-bleu", "--save-dir", tmp_path / "s2"])
    assert code == 0 and "does not decode" not in err, err


def test_captured_logs_keep_whole_table_cells(tmp_path):
    r = run(["nmt-preprocess", *corpus(tmp_path)])
    assert r.returncode == 0, r.stderr
    header = next(line for line in r.stderr.splitlines() if "split" in line)
    for cell in ("split", "lines", "kept", "tokens xx/yy", "unk xx/yy", "too long", "ratio"):
        assert cell in header, header
    assert "…" not in r.stderr
