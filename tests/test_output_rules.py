"""What an output may replace: never one of the command's inputs (by identity: the same path,
a hard link, a symbolic link), never an existing file nmt did not write unless --overwrite;
a rerun of a finished --output run says it is complete and leaves the file alone. And an
exported translate.py takes every checkpoint value as data, never as source code. Real
processes on crafted files."""

import os
import subprocess
import sys

import pytest

from test_translator import make_checkpoint, mixed_lines

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
GENERATE = ["nmt-generate", "-q", "--threads", "1"]


def run(*args, cwd=None):
    return subprocess.run(list(args), capture_output=True, text=True, env=ENV, cwd=cwd,
                          stdin=subprocess.DEVNULL)


def one_error(p, *words):
    assert p.returncode not in (0, None), p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("nmt-generate: error: ")]
    assert len(errors) == 1, p.stderr
    for w in words:
        assert w in errors[0], (w, errors[0])


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    d = tmp_path_factory.mktemp("rules")
    make_checkpoint(d / "tiny.pt")
    (d / "in.txt").write_text("\n".join(mixed_lines(20, seed=5)) + "\n")
    return d


def snapshot(path):
    return path.read_bytes(), os.stat(path).st_mtime_ns


@pytest.mark.parametrize("how", ["same", "dot", "hardlink", "symlink"])
def test_output_naming_the_checkpoint_is_refused(d, tmp_path, how):
    ckpt = tmp_path / "c.pt"
    ckpt.write_bytes((d / "tiny.pt").read_bytes())
    out = {"same": ckpt, "dot": tmp_path / "." / "c.pt", "hardlink": tmp_path / "hard.pt",
           "symlink": tmp_path / "sym.pt"}[how]
    if how == "hardlink":
        os.link(ckpt, out)
    if how == "symlink":
        out.symlink_to(ckpt)
    before = snapshot(ckpt)
    p = run(*GENERATE, str(ckpt), "-i", str(d / "in.txt"), "--output", str(out), "--overwrite")
    one_error(p, "is the input", str(ckpt))
    assert snapshot(ckpt) == before


@pytest.mark.parametrize("stdin", [False, True])
def test_output_naming_the_input_is_refused(d, tmp_path, stdin):
    src = tmp_path / "same.en"
    src.write_text((d / "in.txt").read_text())
    before = snapshot(src)
    args = [*GENERATE, str(d / "tiny.pt"), "-i", "-" if stdin else str(src), "-o", str(src)]
    if stdin:
        # stdin is not a file name nmt can compare: only the file given with -i is an input
        p = subprocess.run(args, capture_output=True, text=True, env=ENV,
                           input=src.read_text())
        assert p.returncode != 0 and "was not written by nmt" in p.stderr, p.stderr
    else:
        p = run(*args)
        one_error(p, "is the input")
    assert snapshot(src) == before


def test_reference_is_an_input(d, tmp_path):
    ref = tmp_path / "ref.de"
    ref.write_text("x\n" * 20)
    p = run(*GENERATE, str(d / "tiny.pt"), "-i", str(d / "in.txt"), "--score-reference",
            "--reference", str(ref), "-o", str(ref), "--overwrite")
    one_error(p, "is the input", "ref.de")
    assert ref.read_text() == "x\n" * 20


# The default run keeps a file as input; the slow run also stdin.
@pytest.mark.parametrize("stdin", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_a_file_nmt_did_not_write_needs_overwrite(d, tmp_path, stdin):
    out = tmp_path / "notes.txt"
    out.write_text("my notes\n")
    args = [*GENERATE, str(d / "tiny.pt"), "-i", "-" if stdin else str(d / "in.txt"),
            "-o", str(out)]
    inp = (d / "in.txt").read_text()
    p = subprocess.run(args, capture_output=True, text=True, env=ENV, input=inp)
    one_error(p, "was not written by nmt", "--overwrite")
    assert out.read_text() == "my notes\n"
    p = subprocess.run([*args, "--overwrite"], capture_output=True, text=True, env=ENV,
                       input=inp)
    assert p.returncode == 0, p.stderr
    assert len(out.read_text().splitlines()) == 20
    # nmt wrote it now: a rerun may replace it without --overwrite
    p = subprocess.run(args, capture_output=True, text=True, env=ENV, input=inp)
    assert p.returncode == 0, p.stderr


def test_an_empty_file_is_written_without_overwrite(d, tmp_path):
    out = tmp_path / "empty.txt"
    out.write_text("")
    p = run(*GENERATE, str(d / "tiny.pt"), "-i", str(d / "in.txt"), "-o", str(out))
    assert p.returncode == 0, p.stderr
    assert len(out.read_text().splitlines()) == 20


def test_a_file_edited_after_nmt_wrote_it_is_protected_again(d, tmp_path):
    out = tmp_path / "out.txt"
    args = [*GENERATE, str(d / "tiny.pt"), "-i", str(d / "in.txt"), "-o", str(out)]
    assert run(*args).returncode == 0
    out.write_text("hand-corrected translations\n")
    p = run(*args)
    one_error(p, "was not written by nmt")
    assert out.read_text() == "hand-corrected translations\n"


def test_a_finished_run_is_complete_on_rerun(d, tmp_path):
    out = tmp_path / "out.txt"
    args = ["nmt-generate", "--threads", "1", str(d / "tiny.pt"), "-i", str(d / "in.txt"),
            "-o", str(out)]
    assert run(*args).returncode == 0
    before = snapshot(out)
    p = run(*args)
    assert p.returncode == 0, p.stderr
    assert "already complete" in p.stderr and "translated" not in p.stderr, p.stderr
    assert snapshot(out) == before
    # another option is another run: it translates again (nmt's own file, so no --overwrite)
    p = run(*args, "--beam", "2")
    assert p.returncode == 0 and "already complete" not in p.stderr, p.stderr
    assert snapshot(out) != before
    # --overwrite translates again even when complete
    p = run(*args, "--beam", "2", "--overwrite")
    assert p.returncode == 0 and "already complete" not in p.stderr, p.stderr


# --- exported translate.py: checkpoint values are data ---------------------------------------

HOSTILE = 'en"); open("PWNED", "w"); _x = ("'


def test_export_pastes_no_checkpoint_text_into_code(d, tmp_path):
    pytest.importorskip("ctranslate2")
    import torch

    ckpt = torch.load(d / "tiny.pt", weights_only=True)
    ckpt["src_codec"]["moses_lang"] = HOSTILE
    ckpt["tgt_codec"]["moses_lang"] = HOSTILE
    bad = tmp_path / "bad.pt"
    torch.save(ckpt, bad)
    out = tmp_path / "export"
    p = subprocess.run(["nmt-export", str(bad), str(out)], capture_output=True,
                       text=True, env=ENV)
    if p.returncode == 0:
        # if it exported at all, running the program must not run the checkpoint's text
        work = tmp_path / "work"
        work.mkdir()
        subprocess.run([sys.executable, str(out / "translate.py")], input="a b\n", text=True,
                       capture_output=True, env=ENV, cwd=work)
        assert not (work / "PWNED").exists()
        assert HOSTILE not in (out / "translate.py").read_text().replace("\\", "")
    else:
        assert "Traceback" not in p.stderr and "Moses language" in p.stderr, p.stderr
    assert not (tmp_path / "PWNED").exists()


def test_snippet_values_are_literals():
    from nmt.errors import NmtError
    from nmt.interop.ct2_export import python_snippet

    side = {"subword": "none", "subword_file": None, "moses_lang": "de"}
    info = {"source": dict(side), "target": dict(side),
            "decoding": {"beam": 4, "lenpen": 0.6, "max_len_a": 1.0, "max_len_b": 50,
                         "min_len": 0, "max_source_len": 1024, "max_output_len": 1024}}
    compile(python_snippet(info), "translate.py", "exec")
    info["target"]["moses_lang"] = HOSTILE
    text = python_snippet(info)
    compile(text, "translate.py", "exec")
    assert f"MosesDetokenizer(lang={HOSTILE!r})" in text
    info["decoding"]["beam"] = "4; import os"
    with pytest.raises(NmtError, match="beam"):
        python_snippet(info)
