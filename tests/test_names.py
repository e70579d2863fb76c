"""One name per thing: a mistyped or other-toolkit subcommand name is answered with the one
meant, and dir(nmt) lists the public API, the lazily imported names included."""

from click.testing import CliRunner

import nmt
from nmt.cli.import_ import main as import_main


def test_an_unknown_subcommand_names_the_one_meant():
    for given, meant in (("hf", "huggingface"), ("HF", "huggingface"), ("opus-mt", "huggingface"),
                         ("fairsq", "fairseq")):
        r = CliRunner().invoke(import_main, [given, "x"])
        assert r.exit_code == 2
        assert r.stderr.strip() == (f"nmt-import: error: No such command '{given}' (did you "
                                    f"mean '{meant}'?)."), r.stderr
    r = CliRunner().invoke(import_main, ["zzz"])
    assert r.exit_code == 2 and r.stderr.strip() == "nmt-import: error: No such command 'zzz'."


def test_dir_lists_the_public_api():
    names = dir(nmt)
    for name in nmt.__all__:
        assert name in names and getattr(nmt, name) is not None
    assert {"Translator", "build_model"} <= set(names)


def test_ref_and_reference_are_one_option_in_both_commands(tmp_path):
    """nmt-score --ref and nmt-generate --reference, each command also taking the other's
    spelling (and giving the same result with it)."""
    from nmt.cli.score import main as score_main

    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("a b c d\ne f g h\n")
    ref.write_text("a b c d\ne f g x\n")
    outs = []
    for flag in ("--ref", "--reference", "-r"):
        r = CliRunner().invoke(score_main, ["-i", str(hyp), flag, str(ref), "--metric", "chrf"])
        assert r.exit_code == 0, r.stderr
        outs.append(r.stdout)
    assert outs[0] == outs[1] == outs[2] and outs[0]
    from nmt.cli.generate import main as generate_main
    from test_translator import make_checkpoint

    ckpt = make_checkpoint(tmp_path / "m.pt")
    src = tmp_path / "src.txt"
    src.write_text("w1 w2\nw3\n")
    tgt = tmp_path / "tgt.txt"
    tgt.write_text("w2 w1\nw3\n")
    scored = [CliRunner().invoke(generate_main, ["-q", "--device", "cpu", str(ckpt), "-i",
                                                 str(src), "--score-reference", flag,
                                                 str(tgt)]).stdout
              for flag in ("--reference", "--ref")]
    assert scored[0] == scored[1] and scored[0].count("\n") == 2
