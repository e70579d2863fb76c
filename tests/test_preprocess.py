"""nmt-preprocess through its real CLI: round trips, vocabularies, shards, filtering, bad input."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from nmt.cli.preprocess import main
from nmt.data import DataDir
from nmt.data.resources import quickstart_dir
from nmt.io import read_lines


def _write(path, lines):
    path.write_bytes("".join(line + "\n" for line in lines).encode("utf-8"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """400 training and 60 valid pairs from the bundled quickstart corpus."""
    d = tmp_path_factory.mktemp("corpus")
    q = quickstart_dir()
    for lang in ("en", "de"):
        _write(d / f"train.{lang}", read_lines(q / f"train.{lang}")[:400])
        _write(d / f"valid.{lang}", read_lines(q / f"valid.{lang}")[:60])
    return d


def run(*args, ok=True):
    res = CliRunner().invoke(main, ["--workers", "1", "-q", *map(str, args)])
    if ok:
        assert res.exit_code == 0, (res.output, res.exception)
    return res


def _no_leftovers(parent):
    """No temporary or half-written directory beside the destination."""
    return not [p.name for p in parent.iterdir() if p.name.startswith(".")]


def _arrays(ds, side):
    return [getattr(ds, side)(i).tolist() for i in range(len(ds))]


# --- what it builds ------------------------------------------------------------------------------

def test_round_trip_joined_bpe(corpus, tmp_path):
    dest = tmp_path / "bin"
    res = run("-s", "en", "-t", "de", "--trainpref", corpus / "train", "--validpref",
              corpus / "valid", "--joined-dictionary", "--vocab-size", 800, "--byte-fallback",
              "--destdir", dest)
    assert res.stdout.splitlines() == [str(dest.absolute())]   # one line: the path
    dd = DataDir.open(res.stdout.strip())
    assert dd.src_codec is dd.tgt_codec and dd.joined and dd.splits == ["train", "valid"]
    assert (dest / "dict.en.txt").read_text() == (dest / "dict.de.txt").read_text()
    for split, n in (("train", 400), ("valid", 60)):
        ds = dd.load_split(split)
        assert len(ds) == n
        for lang, side in (("en", "src"), ("de", "tgt")):
            lines = read_lines(corpus / f"{split}.{lang}")
            sizes = getattr(ds, f"{side}_sizes")
            for i, line in enumerate(lines):
                ids = getattr(ds, side)(i)
                assert len(ids) == sizes[i] and ids.dtype == np.int64
                # Exact, up to runs of spaces (sentencepiece normalizes whitespace).
                assert dd.codec(lang).decode(ids) == " ".join(line.split())
    meta = json.loads((dest / "meta.json").read_text())
    assert meta["format_version"] == 1 and meta["dtype"] == "uint16"
    assert meta["splits"]["train"]["src_tokens"] == int(dd.load_split("train").src_sizes.sum())
    # dict.txt counts are the training frequencies of each symbol.
    counts = dd.src_codec.dictionary.counts
    assert sum(counts) == meta["splits"]["train"]["src_tokens"] + meta["splits"]["train"][
        "tgt_tokens"]
    assert _no_leftovers(tmp_path)


def test_separate_dictionaries_differ(corpus, tmp_path):
    run("-s", "en", "-t", "de", "--trainpref", corpus / "train", "--vocab-size", 500,
        "--destdir", tmp_path / "sep")
    dd = DataDir.open(tmp_path / "sep")
    assert not dd.joined and dd.src_codec is not dd.tgt_codec
    en, de = set(dd.src_codec.dictionary.symbols), set(dd.tgt_codec.dictionary.symbols)
    assert en != de
    assert "▁Männer" in de and "▁Männer" not in en
    assert "▁the" in en and "▁the" not in de
    assert (tmp_path / "sep" / "subword.en.model").read_bytes() != \
        (tmp_path / "sep" / "subword.de.model").read_bytes()


def test_reused_vocabulary_encodes_identically(corpus, tmp_path):
    run("-s", "en", "-t", "de", "--trainpref", corpus / "train", "--validpref",
        corpus / "valid", "--vocab-size", 500, "--subword", "wordpiece", "--destdir",
        tmp_path / "a")
    run("-s", "en", "-t", "de", "--testpref", corpus / "valid", "--reuse-vocab", tmp_path / "a",
        "--destdir", tmp_path / "b")
    run("-s", "en", "-t", "de", "--testpref", corpus / "valid", "--srcdict",
        tmp_path / "a" / "dict.en.txt", "--tgtdict", tmp_path / "a" / "dict.de.txt",
        "--destdir", tmp_path / "c")
    a = DataDir.open(tmp_path / "a").load_split("valid")
    for other in ("b", "c"):
        dd = DataDir.open(tmp_path / other)
        assert dd.splits == ["test"] and dd.subword == "wordpiece"
        b = dd.load_split("test")
        assert _arrays(a, "src") == _arrays(b, "src") and _arrays(a, "tgt") == _arrays(b, "tgt")
        assert (tmp_path / other / "dict.de.txt").read_text() == \
            (tmp_path / "a" / "dict.de.txt").read_text()


def test_sharded_equals_unsharded_and_workers_agree(corpus, tmp_path):
    common = ["-s", "en", "-t", "de", "--trainpref", corpus / "train", "--vocab-size", 500,
              "--seed", 3]
    run(*common, "--destdir", tmp_path / "one")
    run(*common, "--shard-size", 150, "--destdir", tmp_path / "many")
    # The real pool (2 spawned workers, small chunks) must give the same bytes as inline.
    res = CliRunner().invoke(main, ["-q", "--workers", "2", *map(str, common),
                                    "--destdir", str(tmp_path / "pool")])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "many").glob("train.en.*.bin")) == \
        ["train.en.0.bin", "train.en.1.bin", "train.en.2.bin"]
    one = DataDir.open(tmp_path / "one").load_split("train")
    many = DataDir.open(tmp_path / "many").load_split("train")
    assert DataDir.open(tmp_path / "many").meta["splits"]["train"]["shards"] == [150, 150, 100]
    assert one.src_sizes.tolist() == many.src_sizes.tolist()
    assert _arrays(one, "src") == _arrays(many, "src") and _arrays(one, "tgt") == _arrays(many, "tgt")
    for lang in ("en", "de"):
        assert (tmp_path / "one" / f"train.{lang}.0.bin").read_bytes() == \
            (tmp_path / "pool" / f"train.{lang}.0.bin").read_bytes()
    # sentencepiece records its trainer's thread count in the model: the files differ, the
    # models do not, and a checkpoint trained on one resumes on the other (found when a
    # recipe rerun with another --threads preprocessed again and its run could not resume)
    one_dd, pool_dd = DataDir.open(tmp_path / "one"), DataDir.open(tmp_path / "pool")
    assert (tmp_path / "one" / "subword.en.model").read_bytes() != \
        (tmp_path / "pool" / "subword.en.model").read_bytes()
    assert one_dd.src_codec.same_as(pool_dd.src_codec)
    assert one_dd.tgt_codec.same_as(pool_dd.tgt_codec)
    # ... while another vocabulary size is another model
    run(*common[:-4], "--vocab-size", 480, "--seed", 3, "--destdir", tmp_path / "other")
    assert not one_dd.src_codec.same_as(DataDir.open(tmp_path / "other").src_codec)


def test_subword_none_and_moses(tmp_path):
    _write(tmp_path / "t.src", ["the cat sat", "the dog sat", "a cat"] * 3 + ["rare word"])
    _write(tmp_path / "t.tgt", ["(S (NP the cat) sat)"] * 10)
    run("-s", "src", "-t", "tgt", "--trainpref", tmp_path / "t", "--subword", "none",
        "--threshold", 2, "--destdir", tmp_path / "none")
    dd = DataDir.open(tmp_path / "none")
    assert dd.src_codec.dictionary.symbols[4:] == ["cat", "sat", "the", "a", "dog"]
    assert dd.src_codec.decode(dd.load_split("train").src(9)) == "<unk> <unk>"
    assert dd.tgt_codec.decode(dd.load_split("train").tgt(0)) == "(S (NP the cat) sat)"

    _write(tmp_path / "m.en", ["Hello, world!", "It's a test."] * 5)
    _write(tmp_path / "m.de", ["Hallo, Welt!", "Das ist ein Test."] * 5)
    run("-s", "en", "-t", "de", "--trainpref", tmp_path / "m", "--moses", "--vocab-size", 60,
        "--joined-dictionary", "--destdir", tmp_path / "moses")
    dd = DataDir.open(tmp_path / "moses")
    assert dd.src_codec.moses_lang == "en" and dd.tgt_codec.moses_lang == "de"
    assert dd.src_codec.dictionary is dd.tgt_codec.dictionary
    ds = dd.load_split("train")
    assert dd.src_codec.decode(ds.src(0)) == "Hello, world!"
    assert dd.tgt_codec.decode(ds.tgt(1)) == "Das ist ein Test."


def test_filtering_counts_train_only_and_keeps_every_eval_line(tmp_path):
    src = ["a b c", "", "a " * 30, "a", "b c"]
    tgt = ["x y z", "x", "x y", "x " * 12, "y z"]
    for name in ("train", "valid"):
        _write(tmp_path / f"{name}.src", src)
        _write(tmp_path / f"{name}.tgt", tgt)
    run("-s", "src", "-t", "tgt", "--trainpref", tmp_path / "train", "--validpref",
        tmp_path / "valid", "--subword", "none", "--max-len", 20, "--max-len-ratio", 3,
        "--destdir", tmp_path / "f")
    meta = json.loads((tmp_path / "f" / "meta.json").read_text())["splits"]
    flt = {k: meta["train"]["filtered"][k] for k in ("empty", "too_long", "ratio")}
    assert flt == {"empty": 1, "too_long": 1, "ratio": 1}
    assert meta["train"]["sentences"] == 2 and meta["train"]["input_lines"] == 5
    assert meta["valid"]["sentences"] == 5 and meta["valid"]["filtered"]["applied"] is False
    assert meta["valid"]["filtered"]["empty"] == 1          # counted, not dropped
    dd = DataDir.open(tmp_path / "f")
    train, valid = dd.load_split("train"), dd.load_split("valid")
    assert [dd.src_codec.decode(train.src(i)) for i in range(2)] == ["a b c", "b c"]
    assert [dd.src_codec.decode(valid.src(i)) for i in range(5)][:2] == ["a b c", ""]


# --- bad input -----------------------------------------------------------------------------------

def _bad(tmp_path, *args, match):
    dest = tmp_path / "out" / "bin"
    (tmp_path / "out").mkdir(exist_ok=True)
    res = run("-s", "en", "-t", "de", *args, "--destdir", dest, ok=False)
    assert res.exit_code != 0
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nmt-preprocess: error: "), res.stderr
    assert match in err[0], err[0]
    assert res.stdout == ""
    assert not dest.exists() and _no_leftovers(tmp_path / "out")
    return err[0]


def test_mismatched_line_counts(tmp_path):
    _write(tmp_path / "t.en", ["a", "b", "c"])
    _write(tmp_path / "t.de", ["a", "b"])
    _bad(tmp_path, "--trainpref", tmp_path / "t", match="t.en has 3 lines but")
    _write(tmp_path / "t.de", ["a", "b", "c"])
    _write(tmp_path / "v.en", ["a"])
    _write(tmp_path / "v.de", ["a", "b"])
    _bad(tmp_path, "--trainpref", tmp_path / "t", "--validpref", tmp_path / "v",
         "--vocab-size", 10, match="v.de has 2")


def test_missing_file_and_empty_training_set(tmp_path):
    _write(tmp_path / "t.en", ["a"])
    _bad(tmp_path, "--trainpref", tmp_path / "t", match="t.de: no such file")
    _write(tmp_path / "e.en", [])
    _write(tmp_path / "e.de", [])
    _bad(tmp_path, "--trainpref", tmp_path / "e", match="is empty")
    _bad(tmp_path, "--trainpref", tmp_path / "e", "--subword", "none", match="is empty")
    _bad(tmp_path, "--testpref", tmp_path / "e", "--reuse-vocab", tmp_path / "nope",
         match="no such data directory")


def test_invalid_utf8_names_file_and_line(tmp_path):
    _write(tmp_path / "t.en", ["good", "fine", "ok"])
    (tmp_path / "t.de").write_bytes(b"gut\nauch gut\nkaputt \xff\xfe\n")
    _bad(tmp_path, "--trainpref", tmp_path / "t", match="t.de: line 3: invalid UTF-8")
    _write(tmp_path / "t.de", ["gut", "auch gut", "ok"])
    _write(tmp_path / "v.en", ["x"])
    (tmp_path / "v.de").write_bytes(b"\xc3\n")
    _bad(tmp_path, "--trainpref", tmp_path / "t", "--subword", "none", "--validpref",
         tmp_path / "v", match="v.de: line 1: invalid UTF-8")


def test_unwritable_or_occupied_destination(tmp_path):
    _write(tmp_path / "t.en", ["a b"])
    _write(tmp_path / "t.de", ["c d"])
    (tmp_path / "afile").write_text("x")
    res = run("-s", "en", "-t", "de", "--trainpref", tmp_path / "t", "--subword", "none",
              "--destdir", tmp_path / "afile" / "bin", ok=False)
    assert res.exit_code == 1 and "cannot create the data directory" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("precious")
    res = run("-s", "en", "-t", "de", "--trainpref", tmp_path / "t", "--subword", "none",
              "--destdir", tmp_path / "full", ok=False)
    assert res.exit_code == 1 and "--overwrite" in res.stderr
    assert (tmp_path / "full" / "keep.txt").read_text() == "precious"
    # --overwrite replaces only an nmt data directory: this one is not, and it stays
    res = run("-s", "en", "-t", "de", "--trainpref", tmp_path / "t", "--subword", "none",
              "--destdir", tmp_path / "full", "--overwrite", ok=False)
    assert res.exit_code == 1 and len(res.stderr.strip().splitlines()) == 1
    assert "is not an nmt data directory (no meta.json)" in res.stderr
    assert (tmp_path / "full" / "keep.txt").read_text() == "precious"
    run("-s", "en", "-t", "de", "--trainpref", tmp_path / "t", "--subword", "none",
        "--destdir", tmp_path / "bin")
    _write(tmp_path / "t.de", ["e f"])
    run("-s", "en", "-t", "de", "--trainpref", tmp_path / "t", "--subword", "none",
        "--destdir", tmp_path / "bin", "--overwrite")
    assert DataDir.open(tmp_path / "bin").splits == ["train"]
    assert "f" in DataDir.open(tmp_path / "bin").tgt_codec.dictionary
    assert _no_leftovers(tmp_path)


def test_overwrite_never_deletes_the_builds_own_text(tmp_path):
    """A corpus kept inside the data directory it rebuilds would be gone with it: refused."""
    d = tmp_path / "bin"
    _write(tmp_path / "t.en", ["a b"])
    _write(tmp_path / "t.de", ["c d"])
    run("-s", "en", "-t", "de", "--trainpref", tmp_path / "t", "--subword", "none",
        "--destdir", d)
    _write(d / "new.en", ["a b"])
    _write(d / "new.de", ["c d"])
    res = run("-s", "en", "-t", "de", "--trainpref", d / "new", "--subword", "none",
              "--destdir", d, "--overwrite", ok=False)
    assert res.exit_code == 1 and len(res.stderr.strip().splitlines()) == 1
    assert "holds new.en, an input of this build" in res.stderr
    assert (d / "new.en").exists() and (d / "new.de").exists()


def test_dictionaries_of_two_kinds_are_refused(corpus, tmp_path):
    """--srcdict from a bpe data directory with a plain --tgtdict: no data directory holds
    both kinds (it could not be opened), so the build is refused."""
    run("-s", "en", "-t", "de", "--trainpref", corpus / "train", "--vocab-size", 200,
        "--destdir", tmp_path / "bpe")
    _write(tmp_path / "plain.txt", ["a 3", "b 2"])
    _bad(tmp_path, "--testpref", corpus / "valid", "--srcdict", tmp_path / "bpe" / "dict.en.txt",
         "--tgtdict", tmp_path / "plain.txt", "--subword", "none",
         match="--srcdict is a bpe dictionary and --tgtdict a none one")


def test_bpe_dropout_filter_counts_say_they_are_over_the_copies(tmp_path):
    _write(tmp_path / "t.en", ["a b c d"] * 20 + [""] * 2)
    _write(tmp_path / "t.de", ["e f g h"] * 20 + ["x"] * 2)
    res = run("-s", "en", "-t", "de", "--trainpref", tmp_path / "t", "--vocab-size", 30,
              "--bpe-dropout", 0.1, "--bpe-dropout-copies", 3, "--destdir", tmp_path / "bin",
              "-q", "--max-len", 1000)
    meta = DataDir.open(tmp_path / "bin").meta["splits"]["train"]
    assert meta["input_lines"] == 22
    assert meta["filtered"]["empty"] == 6 and meta["filtered"]["over_copies"] == 3
    assert meta["sentences"] == 60
    assert res.exit_code == 0


def test_console_script_pipeline_output(corpus, tmp_path):
    """The installed entry point as a user runs it: one stdout line, summary on stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", "nmt.cli.preprocess", "-s", "en", "-t", "de", "--trainpref",
         str(corpus / "train"), "--vocab-size", "300", "--workers", "1",
         "--destdir", str(tmp_path / "d")],
        capture_output=True, text=True, env={**os.environ, "COLUMNS": "120"}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{tmp_path / 'd'}\n"
    assert "train" in proc.stderr and "400" in proc.stderr


def test_a_failed_install_puts_the_old_directory_back(tmp_path, monkeypatch):
    """If the new directory cannot be renamed into place, the one it replaces is restored."""
    import os

    from nmt.errors import NmtError
    from nmt.io import install_directory

    dest, new = tmp_path / "bin", tmp_path / ".bin.tmp"
    dest.mkdir()
    (dest / "meta.json").write_text("old")
    new.mkdir()
    (new / "meta.json").write_text("new")
    real = os.replace

    def refuse_the_new(src, dst):
        if str(src) == str(new):
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", refuse_the_new)
    with pytest.raises(NmtError, match="cannot install the data directory"):
        install_directory(new, dest, "data directory")
    assert (dest / "meta.json").read_text() == "old"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bin.old")]


# --- found by a review (2026-11-26) -------------------------------------------------------------

def test_inputs_the_build_cannot_use_are_refused_in_one_line(corpus, tmp_path):
    """A pipe as the training split (read twice: nmt-preprocess hung on the second open), a
    side with no text (sentencepiece's C++ assertion before), a vocabulary too small for the
    alphabet (the reason without the C++ location), --moses or --joined-dictionary that the
    reused vocabulary does not have (ignored before), and a subword dictionary taken out of
    its data directory as a plain one (93% <unk> before)."""
    fifo = tmp_path / "ff"
    os.mkfifo(f"{fifo}.en")
    _write(tmp_path / "ff.de", ["a"])
    _bad(tmp_path, "--trainpref", fifo, match="ff.en: not a regular file (a pipe?)")
    _write(tmp_path / "e.en", ["a b", "c d"])
    _write(tmp_path / "e.de", ["", "  "])
    _bad(tmp_path, "--trainpref", tmp_path / "e", match="e.de: no text to learn subwords from")
    err = _bad(tmp_path, "--trainpref", corpus / "train", "--vocab-size", 8,
               match="sentencepiece training failed: Vocabulary size is smaller than")
    assert ".cc(" not in err and "INTERNAL" not in err
    base = run("-s", "en", "-t", "de", "--trainpref", corpus / "train", "--vocab-size", 300,
               "--destdir", tmp_path / "base").stdout.strip()
    for option in ("--moses", "--joined-dictionary"):
        _bad(tmp_path, "--testpref", corpus / "valid", "--reuse-vocab", base, option,
             match=f"{option}, but the reused vocabulary")
    for lang in ("en", "de"):
        (tmp_path / f"plain.{lang}.txt").write_bytes((tmp_path / "base" / f"dict.{lang}.txt")
                                                     .read_bytes())
    _bad(tmp_path, "--validpref", corpus / "valid", "--srcdict", tmp_path / "plain.en.txt",
         "--tgtdict", tmp_path / "plain.de.txt", match="holds subword pieces")


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_removes_the_partial_build_and_says_so_in_one_line(corpus, tmp_path, name):
    """SIGTERM (a scheduler, timeout) ended nmt-preprocess on the spot, leaving its hidden
    temporary directory of partial shards beside --destdir; with workers, Ctrl-C (SIGINT to
    the whole process group) printed each worker's traceback above the error line."""
    import signal
    import time

    sig = getattr(signal, name)

    big = tmp_path / "big"
    lines = read_lines(corpus / "train.en")
    for lang in ("en", "de"):
        _write(tmp_path / f"big.{lang}", lines * 400)             # 160,000 pairs
    dest = tmp_path / "out" / "d"
    (tmp_path / "out").mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "nmt.cli.preprocess", "-s", "en", "-t", "de", "--trainpref",
         str(big), "--vocab-size", "300", "--workers", "2", "--destdir", str(dest), "-q"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.monotonic() + 60
    while not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".d.tmp")]:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.5)
    os.killpg(proc.pid, sig)                  # the parent and its workers, as a terminal does
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert err.strip().splitlines() == [f"nmt-preprocess: error: interrupted by {name}"], err
    assert out == "" and not dest.exists() and _no_leftovers(tmp_path / "out")


def test_a_wordpiece_build_is_the_same_on_every_run_and_any_workers(corpus, tmp_path):
    """tokenizers' WordPieceTrainer numbered its symbols in hash-map order, which also broke
    ties between merges: each run gave another dict.txt and other shards (with one worker
    too). nmt learns the vocabulary itself, the same every time."""
    built = []
    for i, workers in enumerate((1, 1, 2)):
        dest = tmp_path / f"wp{i}"
        res = CliRunner().invoke(main, ["-s", "en", "-t", "de", "--trainpref", str(corpus /
                                        "train"), "--vocab-size", "400", "--subword",
                                        "wordpiece", "--workers", str(workers), "-q",
                                        "--destdir", str(dest)])
        assert res.exit_code == 0, res.output
        built.append({p.name: p.read_bytes() for p in sorted(dest.iterdir())
                      if p.name != "meta.json"})
    assert built[0] == built[1] == built[2]
    assert b"##" in built[0]["dict.en.txt"]
