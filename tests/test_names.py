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
