"""BPE-dropout (nmt-preprocess --bpe-dropout): exact at p=0, reproducible by seed in any process
and with any --workers, only the training split sampled, bad combinations refused in one line."""

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from nmt.cli.preprocess import main
from nmt.data import DataDir
from nmt.data.bpe_dropout import DropoutBPE
from nmt.data.resources import quickstart_dir
from nmt.io import read_lines


def _write(path, lines):
    path.write_bytes("".join(line + "\n" for line in lines).encode("utf-8"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """500 training and 50 valid pairs of the bundled corpus, plus lines with characters the
    vocabulary cannot hold (runs of unknown characters)."""
    d = tmp_path_factory.mktemp("corpus")
    q = quickstart_dir()
    odd = ["Zwei Männer ☃☃ am Strand.", "ein 日本語 Satz", "  spaces   around  ", "ﬁne Ｗｉｄｅ"]
    for lang in ("en", "de"):
        _write(d / f"train.{lang}", read_lines(q / f"train.{lang}")[:500])
        _write(d / f"valid.{lang}", read_lines(q / f"valid.{lang}")[:46] + odd)
    return d


def run(*args, workers=1, ok=True):
    res = CliRunner().invoke(main, ["--workers", str(workers), "-q", *map(str, args)])
    if ok:
        assert res.exit_code == 0, (res.output, res.exception)
    return res


@pytest.fixture(scope="module")
def plain(corpus, tmp_path_factory):
    dest = tmp_path_factory.mktemp("plain") / "bin"
    run("-s", "en", "-t", "de", "--trainpref", corpus / "train", "--validpref", corpus / "valid",
        "--joined-dictionary", "--vocab-size", 600, "--destdir", dest)
    return DataDir.open(dest)


def _sp(dd):
    return dd.src_codec.subword.sp


def _lines(corpus):
    return read_lines(corpus / "train.en") + read_lines(corpus / "valid.de")


def test_p0_is_sentencepiece_exactly(plain, corpus):
    sp = _sp(plain)
    lines = _lines(corpus)
    assert DropoutBPE(sp).encode(lines, 0.0, seed=1) == sp.encode(lines, out_type=int)


def test_sampled_pieces_spell_the_same_text_in_more_pieces(plain, corpus):
    sp = _sp(plain)
    lines = read_lines(corpus / "train.en")
    sampled = DropoutBPE(sp).encode(lines, 0.1, seed=1)
    exact = sp.encode(lines, out_type=int)
    assert [sp.decode(x) for x in sampled] == [sp.decode(x) for x in exact]
    n_sampled, n_exact = sum(map(len, sampled)), sum(map(len, exact))
    assert n_exact * 1.05 < n_sampled < n_exact * 1.6      # p=0.1 splits some words, not all
    assert sum(a != b for a, b in zip(sampled, exact)) > len(lines) // 2
    # p near 1: almost every word falls apart into characters
    chars = DropoutBPE(sp).encode(lines[:20], 0.99, seed=1)
    pieces = [sp.id_to_piece(i) for x in chars for i in x]
    assert sum(len(x) == 1 for x in pieces) > 0.95 * len(pieces)


_SUBPROCESS = """
import sys, json
from nmt.data import DataDir
from nmt.data.bpe_dropout import DropoutBPE
dd = DataDir.open(sys.argv[1])
lines = open(sys.argv[2], encoding="utf-8").read().splitlines()
print(json.dumps(DropoutBPE(dd.src_codec.subword.sp).encode(lines, 0.1, int(sys.argv[3]))))
"""


def test_same_seed_same_pieces_in_another_process(plain, corpus):
    # sentencepiece's own sampling (enable_sampling) draws differently in each process even
    # with set_random_generator_seed: the reason this module exists
    def sample(seed):
        return subprocess.run([sys.executable, "-c", _SUBPROCESS, str(plain.path),
                               str(corpus / "train.en"), str(seed)], check=True,
                              capture_output=True, text=True).stdout
    here = DropoutBPE(_sp(plain)).encode(read_lines(corpus / "train.en"), 0.1, 7)
    assert json.loads(sample(7)) == here and sample(7) == sample(7)
    assert json.loads(sample(8)) != here


def test_preprocess_samples_train_copies_only_and_any_workers_agree(corpus, plain, tmp_path):
    common = ["-s", "en", "-t", "de", "--trainpref", corpus / "train", "--validpref",
              corpus / "valid", "--joined-dictionary", "--vocab-size", 600,
              "--bpe-dropout", 0.1, "--bpe-dropout-copies", 3]
    run(*common, "--destdir", tmp_path / "one")
    run(*common, "--destdir", tmp_path / "pool", workers=2)
    for name in ("train.en.0.bin", "train.de.0.bin", "valid.en.0.bin", "dict.en.txt"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "pool" / name).read_bytes()
    dd = DataDir.open(tmp_path / "one")
    meta = dd.meta["splits"]
    assert meta["train"]["bpe_dropout"] == {"p": 0.1, "copies": 3, "seed": 1}
    assert meta["train"]["input_lines"] == 500 and meta["train"]["sentences"] == 1500
    assert "bpe_dropout" not in meta["valid"]
    assert dd.src_codec.same_as(plain.src_codec)            # the same subword model
    train, exact = dd.load_split("train"), plain.load_split("train")
    src = [train.src(i).tolist() for i in range(len(train))]
    ref = [exact.src(i).tolist() for i in range(len(exact))]
    # three differently sampled copies, in corpus order, each spelling the same text
    sp = _sp(dd)
    copies = [src[k * 500:(k + 1) * 500] for k in range(3)]
    assert copies[0] != copies[1] != copies[2] and all(c != ref for c in copies)
    for c in copies:
        assert [sp.decode(x) for x in c] == [sp.decode(x) for x in ref]
    # validation keeps the one segmentation that decoding uses
    valid, exact_valid = dd.load_split("valid"), plain.load_split("valid")
    assert [valid.src(i).tolist() for i in range(len(valid))] == \
        [exact_valid.src(i).tolist() for i in range(len(exact_valid))]
    # another seed, other samples
    run(*common, "--seed", 2, "--destdir", tmp_path / "seed2")
    assert (tmp_path / "seed2" / "train.en.0.bin").read_bytes() != \
        (tmp_path / "one" / "train.en.0.bin").read_bytes()
    # a rerun with the same options is recognized as done; with other options it is refused
    assert run(*common, "--destdir", tmp_path / "one").stdout.strip().endswith("one")
    res = run(*common[:-2], "--bpe-dropout-copies", 4, "--destdir", tmp_path / "one", ok=False)
    assert res.exit_code != 0 and "options --bpe-dropout-copies differ" in res.output


@pytest.mark.parametrize("args, match", [
    (["--bpe-dropout", 1.0], "--bpe-dropout must be in [0, 1)"),
    (["--bpe-dropout", -0.1], "--bpe-dropout must be in [0, 1)"),
    (["--bpe-dropout", 0.1, "--bpe-dropout-copies", 0], "--bpe-dropout-copies must be >= 1"),
    (["--bpe-dropout", 0.1, "--subword", "wordpiece"], "needs --subword bpe"),
])
def test_bad_options_are_one_line_errors(corpus, tmp_path, args, match):
    res = run("-s", "en", "-t", "de", "--trainpref", corpus / "train", "--vocab-size", 600,
              "--destdir", tmp_path / "x", *args, ok=False)
    assert res.exit_code == 2 or res.exit_code == 1
    assert match in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_no_dropout_builds_stay_the_same_build(corpus, tmp_path):
    """A directory built without --bpe-dropout (as before the option existed) keeps its record:
    the new options at their defaults are not part of it, so older data directories are still
    recognized as the same build."""
    common = ["-s", "en", "-t", "de", "--trainpref", corpus / "train", "--vocab-size", 600,
              "--destdir", tmp_path / "bin"]
    run(*common)
    meta = json.loads((tmp_path / "bin" / "meta.json").read_text())
    assert "bpe_dropout" not in meta["built_from"]["options"]
    assert "bpe_dropout_copies" not in meta["built_from"]["options"]
    stamp = (tmp_path / "bin" / "meta.json").stat().st_mtime_ns
    run(*common)                                   # recognized: nothing is rewritten
    assert (tmp_path / "bin" / "meta.json").stat().st_mtime_ns == stamp


def test_older_records_of_input_files_are_the_same_build(corpus, tmp_path):
    """Data directories built before input files were recorded as nmt-generate records them
    name a file's size "bytes": still recognized, nothing rebuilt."""
    common = ["-s", "en", "-t", "de", "--trainpref", corpus / "train", "--vocab-size", 600,
              "--destdir", tmp_path / "bin"]
    run(*common)
    path = tmp_path / "bin" / "meta.json"
    meta = json.loads(path.read_text())
    files = meta["built_from"]["files"]
    assert files and all("size" in f for f in files.values())
    for f in files.values():
        f["bytes"] = f.pop("size")
    path.write_text(json.dumps(meta))
    stamp = path.stat().st_mtime_ns
    run(*common)
    assert path.stat().st_mtime_ns == stamp


@pytest.fixture(scope="module")
def byte_fallback(corpus, tmp_path_factory):
    dest = tmp_path_factory.mktemp("bytes") / "bin"
    run("-s", "en", "-t", "de", "--trainpref", corpus / "train", "--joined-dictionary",
        "--vocab-size", 600, "--byte-fallback", "--character-coverage", 0.999, "--destdir", dest)
    return DataDir.open(dest)


def test_byte_fallback_spells_unknown_characters_in_bytes(byte_fallback, corpus):
    sp = _sp(byte_fallback)
    lines = _lines(corpus)
    assert any(sp.is_byte(i) for x in sp.encode(lines, out_type=int) for i in x)
    assert DropoutBPE(sp).encode(lines, 0.0, seed=1) == sp.encode(lines, out_type=int)
    sampled = DropoutBPE(sp).encode(lines, 0.1, seed=1)
    assert sp.unk_id() not in {i for x in sampled for i in x}
    assert [sp.decode(x) for x in sampled] == lines_as_decoded(sp, lines)


def lines_as_decoded(sp, lines):
    return [sp.decode(x) for x in sp.encode(lines, out_type=int)]


def test_long_words_merge_through_the_heap(plain):
    """A word past LONG_WORD characters (a URL, a run without spaces) merges in O(n log n):
    at p=0 the same ids as sentencepiece, at p>0 the same text in more pieces."""
    from nmt.data import bpe_dropout
    sp = _sp(plain)
    word = "ZweiMännerstehenamStrandundschauenaufdasMeer" * 200      # 9,000 characters
    lines = [word, "a " + word[:100] + " b", "kurz"]
    assert len(word) > bpe_dropout.LONG_WORD
    assert DropoutBPE(sp).encode(lines, 0.0, seed=1) == sp.encode(lines, out_type=int)
    sampled = DropoutBPE(sp).encode(lines, 0.2, seed=1)
    assert [sp.decode(x) for x in sampled] == lines_as_decoded(sp, lines)
    assert len(sampled[0]) > len(sp.encode(word))


def test_negative_seed_and_rerun_without_dropout(corpus, tmp_path):
    common = ["-s", "en", "-t", "de", "--trainpref", corpus / "train", "--vocab-size", 600,
              "--destdir", tmp_path / "bin"]
    run(*common, "--seed", -1, "--bpe-dropout", 0.1, "--bpe-dropout-copies", 2)
    res = run(*common, "--seed", -1, ok=False)
    assert res.exit_code != 0 and "options --bpe-dropout, --bpe-dropout-copies differ" in res.output
