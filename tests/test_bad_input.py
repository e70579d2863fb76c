"""Bad input for every CLI: a one-line error naming the file and the problem, a non-zero exit,
no traceback, and no partly written output that looks complete.

One table over nmt-preprocess, nmt-train, nmt-generate and nmt-score (in-process through
click's CliRunner), then a full disk simulated at the moment each command saves its output.
"""

import errno
import io
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from nmt.cli.generate import main as generate_main
from nmt.cli.preprocess import main as preprocess_main
from nmt.cli.score import main as score_main
from nmt.cli.train import main as train_main

CLIS = {"nmt-preprocess": preprocess_main, "nmt-train": train_main,
        "nmt-generate": generate_main, "nmt-score": score_main}
LONG = " ".join(["w1"] * 33334)          # a line of 100,001 characters


def invoke(prog, args, stdin=None):
    r = CliRunner().invoke(CLIS[prog], [str(a) for a in args], input=stdin)
    return r.exit_code, r.stdout, r.stderr


@pytest.fixture(scope="module")
def f(tmp_path_factory):
    """Paths of good and bad files, a data directory and a checkpoint trained on it."""
    d = tmp_path_factory.mktemp("bad_input")
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(20)]
    src = [" ".join(rng.choice(words, size=rng.integers(2, 7))) for _ in range(40)]
    for split, lines in (("train", src), ("valid", src[:6])):
        (d / f"{split}.xx").write_text("\n".join(lines) + "\n")
        (d / f"{split}.yy").write_text("\n".join(s[::-1] for s in lines) + "\n")
    code, out, err = invoke("nmt-preprocess", ["-s", "xx", "-t", "yy", "--trainpref",
                            d / "train", "--validpref", d / "valid", "--destdir", d / "bin",
                            "--subword", "none", "--joined-dictionary", "--workers", "1", "-q"])
    assert code == 0, err
    data = out.strip()
    code, out, err = invoke("nmt-train", [data, "--arch", "transformer_tiny", "--max-tokens",
                            "100", "--max-update", "2", "--save-dir", d / "ckpt",
                            "--threads", "1", "-q"])
    assert code == 0, err
    ckpt = out.strip()

    p = {"dir": d, "data": data, "ckpt": ckpt, "missing": d / "no" / "such.txt"}
    (d / "empty.xx").write_bytes(b"")
    (d / "empty.yy").write_bytes(b"")
    p["empty"] = d / "empty.xx"
    (d / "badutf8.xx").write_bytes(b"w1 w2\nw3 \xff\xfe w4\n")
    (d / "badutf8.yy").write_bytes(b"w2 w1\nw4 w3\n")
    p["badutf8"] = d / "badutf8.xx"
    garbage = bytes(np.random.default_rng(1).integers(0, 256, 4000, dtype=np.uint8))
    (d / "garbage.xx").write_bytes(b"\x00\x01\xff" + garbage)
    (d / "garbage.yy").write_text("w1\n" * (garbage.count(b"\n") + 1))
    p["garbage"] = d / "garbage.xx"
    (d / "long.xx").write_text(f"w1 w2\n{LONG}\nw3\n")
    (d / "long.yy").write_text(f"w2 w1\n{LONG}\nw3\n")
    p["long"] = d / "long.xx"
    (d / "mismatch.xx").write_text("w1\nw2\nw3\n")
    (d / "mismatch.yy").write_text("w1\nw2\n")
    p["three"], p["two"] = d / "mismatch.xx", d / "mismatch.yy"
    (d / "good.txt").write_text("w1 w2\nw3\n\nw4 w5 w6\n")
    p["good"] = d / "good.txt"

    # A data directory from an incompatible (future) version, and other broken ones.
    for name in ("v99", "badmeta", "noshard"):
        shutil.copytree(data, d / name)
    meta = json.loads((d / "v99" / "meta.json").read_text())
    meta["format_version"] = 99
    (d / "v99" / "meta.json").write_text(json.dumps(meta))
    (d / "badmeta" / "meta.json").write_bytes(b"\x00\xff{garbage")
    (d / "noshard" / "train.xx.0.bin").unlink()
    (d / "notdata").mkdir()
    p.update(v99=d / "v99", badmeta=d / "badmeta", noshard=d / "noshard",
             notdata=d / "notdata")

    # Checkpoints: empty, truncated, garbage, future version, one pointing at the v99 data.
    raw = open(ckpt, "rb").read()
    for name, content in (("empty.pt", b""), ("trunc.pt", raw[: len(raw) // 2]),
                          ("garbage.pt", garbage)):
        (d / name).write_bytes(content)
        p[name] = d / name
    ck = torch.load(ckpt, weights_only=True)
    torch.save({**ck, "format_version": 99}, d / "v99.pt")
    torch.save({**ck, "data_dir": str(d / "v99")}, d / "onv99.pt")
    p["v99.pt"], p["onv99.pt"] = d / "v99.pt", d / "onv99.pt"
    return p


def pp(f, prefix, *extra):
    return ["-s", "xx", "-t", "yy", "--trainpref", prefix, "--destdir", f["dir"] / "out-pp",
            "--subword", "none", "--workers", "1", *extra]


def tr(data, f, *extra):
    return [data, "--arch", "transformer_tiny", "--max-update", "1", "--threads", "1",
            "--save-dir", f["dir"] / "out-tr", *extra]


def gen(f, ckpt, inp, *extra):
    return [ckpt, "-i", inp, "--output", f["dir"] / "out-gen.txt", "--threads", "1", *extra]


def sc(ref, hyp):
    return ["--ref", ref, "--hyp", hyp]


# (cli, args from the fixture, words the error line must contain)
CASES = {
    "pp-missing": ("nmt-preprocess", lambda f: pp(f, f["dir"] / "nope"), ["nope.xx", "no such"]),
    "pp-empty": ("nmt-preprocess", lambda f: pp(f, f["dir"] / "empty"), ["empty.", "empty"]),
    "pp-badutf8": ("nmt-preprocess", lambda f: pp(f, f["dir"] / "badutf8"),
                   ["badutf8.xx", "line 2", "UTF-8"]),
    "pp-garbage": ("nmt-preprocess", lambda f: pp(f, f["dir"] / "garbage"),
                   ["garbage.xx", "UTF-8"]),
    "pp-mismatch": ("nmt-preprocess", lambda f: pp(f, f["dir"] / "mismatch"),
                    ["mismatch.xx", "mismatch.yy", "3 lines", "2"]),
    "pp-v99": ("nmt-preprocess", lambda f: pp(f, f["dir"] / "train", "--reuse-vocab", f["v99"]),
               ["v99", "version 99"]),
    "tr-missing": ("nmt-train", lambda f: tr(f["dir"] / "nodata", f), ["nodata", "no such"]),
    "tr-notdata": ("nmt-train", lambda f: tr(f["notdata"], f), ["notdata", "meta.json"]),
    "tr-v99": ("nmt-train", lambda f: tr(f["v99"], f), ["v99", "version 99"]),
    "tr-badmeta": ("nmt-train", lambda f: tr(f["badmeta"], f), ["badmeta", "meta.json"]),
    "tr-noshard": ("nmt-train", lambda f: tr(f["noshard"], f), ["train.xx.0.bin", "no such"]),
    "tr-textfile": ("nmt-train", lambda f: tr(f["good"], f), ["good.txt", "not a directory"]),
    "avg-empty": ("nmt-train", lambda f: ["--average", f["ckpt"], f["empty.pt"], "--output",
                                          f["dir"] / "out-avg.pt"], ["empty.pt", "empty"]),
    "avg-trunc": ("nmt-train", lambda f: ["--average", f["ckpt"], f["trunc.pt"], "--output",
                                          f["dir"] / "out-avg.pt"], ["trunc.pt", "truncated"]),
    "avg-v99": ("nmt-train", lambda f: ["--average", f["ckpt"], f["v99.pt"], "--output",
                                        f["dir"] / "out-avg.pt"], ["v99.pt", "format_version 99"]),
    "gen-missing-ckpt": ("nmt-generate", lambda f: gen(f, f["dir"] / "nope.pt", f["good"]),
                         ["nope.pt", "no such"]),
    "gen-empty-ckpt": ("nmt-generate", lambda f: gen(f, f["empty.pt"], f["good"]),
                       ["empty.pt", "empty"]),
    "gen-trunc-ckpt": ("nmt-generate", lambda f: gen(f, f["trunc.pt"], f["good"]),
                       ["trunc.pt", "truncated"]),
    "gen-garbage-ckpt": ("nmt-generate", lambda f: gen(f, f["garbage.pt"], f["good"]),
                         ["garbage.pt", "checkpoint"]),
    "gen-v99-ckpt": ("nmt-generate", lambda f: gen(f, f["v99.pt"], f["good"]),
                     ["v99.pt", "format_version 99"]),
    "gen-missing-input": ("nmt-generate", lambda f: gen(f, f["ckpt"], f["missing"]),
                          ["such.txt", "no such"]),
    "gen-badutf8": ("nmt-generate", lambda f: gen(f, f["ckpt"], f["badutf8"]),
                    ["badutf8.xx", "line 2", "UTF-8"]),
    "gen-garbage": ("nmt-generate", lambda f: gen(f, f["ckpt"], f["garbage"]),
                    ["garbage.xx", "UTF-8"]),
    "gen-dir-input": ("nmt-generate", lambda f: gen(f, f["ckpt"], f["dir"]),
                      [None, "directory"]),
    "sc-missing-ref": ("nmt-score", lambda f: sc(f["missing"], f["good"]), ["such.txt", "no such"]),
    "sc-missing-hyp": ("nmt-score", lambda f: sc(f["good"], f["missing"]), ["such.txt", "no such"]),
    "sc-empty-hyp": ("nmt-score", lambda f: sc(f["good"], f["empty"]), ["empty.xx", "empty"]),
    "sc-empty-ref": ("nmt-score", lambda f: sc(f["empty"], f["good"]), ["empty.xx", "empty"]),
    "sc-badutf8": ("nmt-score", lambda f: sc(f["good"], f["badutf8"]),
                   ["badutf8.xx", "line 2", "UTF-8"]),
    "sc-garbage-ref": ("nmt-score", lambda f: sc(f["garbage"], f["good"]),
                       ["garbage.xx", "UTF-8"]),
    "sc-mismatch": ("nmt-score", lambda f: sc(f["three"], f["two"]),
                    ["mismatch.xx", "mismatch.yy", "3", "2 lines"]),
}


def assert_one_line_error(prog, code, stderr, words):
    assert code not in (0, None), stderr
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    errors = [l for l in stderr.splitlines() if l.startswith(f"{prog}: error: ")]
    assert len(errors) == 1, stderr
    assert stderr.rstrip().endswith(errors[0])                  # the last thing said
    for w in words:
        assert w is None or w in errors[0], (w, errors[0])


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_gives_a_one_line_error(f, case):
    prog, make_args, words = CASES[case]
    code, out, err = invoke(prog, make_args(f))
    words = [w.replace("{dir}", str(f["dir"])) if w else w for w in words]
    assert_one_line_error(prog, code, err, words)
    # Nothing that looks like a finished output.
    assert out == ""
    for name in ("out-pp", "out-gen.txt", "out-avg.pt"):
        assert not (f["dir"] / name).exists(), name
    assert not list((f["dir"]).glob(".out-*"))                  # no temporaries left
    assert not list((f["dir"] / "out-tr").glob("checkpoint*")) \
        if (f["dir"] / "out-tr").exists() else True


def test_pipeline_with_data_from_an_incompatible_version(f):
    # nmt-generate with no CHECKPOINT translates the test split of the checkpoint's data dir.
    code, out, err = invoke("nmt-generate", ["--split", "valid"], stdin=f"{f['onv99.pt']}\n")
    assert_one_line_error("nmt-generate", code, err, [str(f["v99"]), "version 99"])
    assert out == ""


def test_resume_from_an_unreadable_checkpoint_is_an_error(f, tmp_path):
    (tmp_path / "checkpoint_last.pt").write_bytes(b"\x00" * 100)
    code, out, err = invoke("nmt-train", [f["data"], "--arch", "transformer_tiny",
                                          "--max-update", "1", "--save-dir", tmp_path])
    assert_one_line_error("nmt-train", code, err, [str(tmp_path), "no intact checkpoint"])
    assert "checkpoint_last.pt" in err                            # the warning names it


# --- input that is odd but valid: no error, one output line per input line ------------------

def test_long_lines_and_empty_input_are_handled(f, tmp_path):
    # 100,000 characters: truncated for the model with a warning naming the line.
    code, out, err = invoke("nmt-generate", [f["ckpt"], "-i", f["long"], "--threads", "1"])
    assert code == 0, err
    assert len(out.split("\n")) == 4 and out.endswith("\n")
    assert "line 2" in err
    code, out, err = invoke("nmt-generate", [f["ckpt"], "-i", f["empty"], "--output",
                                             tmp_path / "empty.out"])
    assert code == 0 and (tmp_path / "empty.out").read_bytes() == b""
    code, out, err = invoke("nmt-score", ["--ref", f["long"], "--hyp", f["long"], "--sentence"])
    assert code == 0, err
    assert len(out.splitlines()) == 3
    # Training data: the long pair is filtered by --max-len, the others kept.
    code, out, err = invoke("nmt-preprocess", ["-s", "xx", "-t", "yy", "--trainpref",
                            f["dir"] / "long", "--destdir", tmp_path / "long-bin",
                            "--subword", "none", "--workers", "1", "-q"])
    assert code == 0, err
    meta = json.loads((tmp_path / "long-bin" / "meta.json").read_text())
    assert meta["splits"]["train"]["sentences"] == 2


# --- a full disk at the moment of saving ---------------------------------------------------

def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _FillingFile(io.FileIO):
    """A file on a disk with ``room`` bytes left: a write gets what fits (a short count, as
    write(2) returns), then ENOSPC. Only this lowest layer is simulated; above it run Python's
    real buffered writer and torch.save, which raises its own RuntimeError ("[enforce fail at
    inline_container.cc] unexpected pos"), not an OSError."""

    room = 4096

    def write(self, b):
        if self.room <= 0:
            _no_space()
        n = min(len(b), self.room)
        self.room -= n
        return super().write(bytes(b[:n]))


def _limit_file_size():
    # The child's files stop growing at 64 KiB: write(2) then fails with EFBIG ("File too
    # large"); SIGXFSZ, which would kill it instead, is ignored.
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))


@pytest.mark.parametrize("how", ["no-space", "file-size-limit"])
def test_full_disk_while_saving_a_checkpoint(f, tmp_path, monkeypatch, how):
    save = tmp_path / "ck"
    args = [f["data"], "--arch", "transformer_tiny", "--max-update", "2", "--save-dir", save,
            "--threads", "1"]
    if how == "no-space":
        if not os.path.isdir("/proc/self/fd"):
            pytest.skip("needs Linux's /proc/self/fd to tell the checkpoint's file")
        real_fdopen = os.fdopen

        def fdopen(fd, mode="r", *a, **k):
            # Only the checkpoints' temporaries are on the full disk.
            if ".checkpoint_" not in os.readlink(f"/proc/self/fd/{fd}"):
                return real_fdopen(fd, mode, *a, **k)
            return io.BufferedWriter(_FillingFile(fd, "wb"))

        monkeypatch.setattr(os, "fdopen", fdopen)
        code, out, err = invoke("nmt-train", args)
        reason = "No space left on device"
    else:
        r = subprocess.run(["nmt-train", *map(str, args)], capture_output=True, text=True,
                           timeout=120, preexec_fn=_limit_file_size,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
        code, out, err = r.returncode, r.stdout, r.stderr
        reason = "File too large"
    assert_one_line_error("nmt-train", code, err, [])
    message = err.rstrip().splitlines()[-1]
    assert re.fullmatch(rf"nmt-train: error: {re.escape(str(save))}/checkpoint_\w+\.pt: "
                        rf"cannot write \({reason}\)", message), message
    assert out == ""
    assert sorted(p.name for p in save.iterdir() if "checkpoint" in p.name) == []


@pytest.mark.parametrize("prog", ["nmt-preprocess", "nmt-generate", "nmt-train --average"])
def test_full_disk_when_the_output_is_synced(f, tmp_path, monkeypatch, prog):
    # Delayed allocation: a full disk often shows only at fsync.
    monkeypatch.setattr(os, "fsync", _no_space)
    if prog == "nmt-preprocess":
        out_path = tmp_path / "bin"
        args = ["-s", "xx", "-t", "yy", "--trainpref", f["dir"] / "train", "--destdir",
                out_path, "--subword", "none", "--workers", "1"]
    elif prog == "nmt-generate":
        out_path = tmp_path / "hyp.txt"
        args = [f["ckpt"], "-i", f["good"], "--output", out_path, "--threads", "1"]
    else:
        out_path = tmp_path / "avg.pt"
        twin = f["dir"] / "ckpt_copy.pt"     # a second file: the same file twice is refused
        if not twin.exists():
            shutil.copyfile(f["ckpt"], twin)
        args = ["--average", f["ckpt"], twin, "--output", out_path]
    code, out, err = invoke(prog.split()[0], args)
    assert_one_line_error(prog.split()[0], code, err, ["No space left"])
    assert str(tmp_path) in err
    assert out == ""
    assert not out_path.exists()
    assert list(tmp_path.iterdir()) == []                         # no temporaries either


class _FullDevice(io.RawIOBase):
    """The device under a redirected stdout, full: the kernel refuses every write (ENOSPC).
    Only this lowest layer is simulated; the commands write through Python's real buffered
    (or, as under ``python -u``, unbuffered) stdout. ``full = False`` empties it afterwards."""

    full = True

    def writable(self):
        return True

    def write(self, b):
        if self.full:
            _no_space()
        return len(b)


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize("prog", ["nmt-score", "nmt-generate"])
def test_full_disk_on_stdout(f, capsys, prog, buffered):
    # Buffered (a redirected stdout): small output fails only when flushed, for nmt-score in
    # LineWriter.close; unbuffered: at the first write.
    args = (["--ref", f["good"], "--hyp", f["good"]] if prog == "nmt-score"
            else [f["ckpt"], "-i", f["good"], "--threads", "1"])
    device = _FullDevice()
    stdout = io.TextIOWrapper(io.BufferedWriter(device) if buffered else device,
                              encoding="utf-8", write_through=True)
    real_stdout, sys.stdout = sys.stdout, stdout
    try:
        with pytest.raises(SystemExit) as exit_:
            CLIS[prog].main([str(a) for a in args], prog_name=prog, standalone_mode=False)
    finally:
        sys.stdout = real_stdout
        device.full = False
    err = capsys.readouterr().err
    assert_one_line_error(prog, exit_.value.code, err, ["<stdout>: cannot write",
                                                        "No space left"])


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs Linux's /dev/full")
def test_full_disk_when_a_line_writer_closes_its_file():
    # A few lines stay in the file's buffer: the disk is found full by the flush in close().
    from nmt.errors import NmtError
    from nmt.io import LineWriter

    out = LineWriter("/dev/full")
    out.write("a line")
    with pytest.raises(NmtError, match=r"^/dev/full: cannot write \(No space left"):
        out.close()
    assert out._f.closed
