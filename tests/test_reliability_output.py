"""Nothing lost, nothing mislabelled on the way out: every byte of output written or
a one-line error naming the output, under PYTHONUNBUFFERED=1 too (a real file size limit makes
the kernel take part of a write); jsonl ids that count input lines across chunks; SIGTERM and
SIGINT that never cut a line in a pipe and never leave a temporary file; temporary directories
of killed runs removed by the next run. Real processes, real signals, output compared byte for
byte with an uninterrupted run or with the library."""

import array
import fcntl
import io
import json
import os
import resource
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from nmt.search.config import BatchConfig
from nmt.search.translator import Translator

from test_translator import make_checkpoint, mixed_lines

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
GENERATE = ["nmt-generate", "-q", "--threads", "1"]


@pytest.fixture(scope="module")
def f(tmp_path_factory):
    d = tmp_path_factory.mktemp("output")
    ckpt = make_checkpoint(d / "tiny.pt")
    lines = mixed_lines(150, seed=3)
    (d / "in.txt").write_text("\n".join(lines) + "\n")
    expected = Translator.from_checkpoint(ckpt).translate(lines)
    return {"dir": d, "ckpt": str(ckpt), "lines": lines, "in": str(d / "in.txt"),
            "expected": "".join(t + "\n" for t in expected).encode()}


def error_line(prog, code, stderr, *words):
    """The one error line, the last thing said, with no traceback."""
    assert code not in (0, None), stderr
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    errors = [ln for ln in stderr.splitlines() if ln.startswith(f"{prog}: error: ")]
    assert len(errors) == 1 and stderr.rstrip().endswith(errors[0]), stderr
    for w in words:
        assert w in errors[0], (w, errors[0])
    return errors[0]


# --- every byte or an error ----------------------------------------------------------------------

def _file_size_limit(limit):
    def preexec():
        # Past the limit the kernel writes what fits and returns the count, then EFBIG; the
        # default action of SIGXFSZ (kill) would hide that.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return preexec


@pytest.mark.parametrize("prog", ["nmt-generate", "nmt-score"])
def test_a_short_write_to_stdout_is_finished_or_an_error(f, tmp_path, prog):
    args = ([*GENERATE, f["ckpt"], "-i", f["in"]] if prog == "nmt-generate"
            else ["nmt-score", "--ref", f["in"], "--hyp", f["in"], "--sentence", "-m", "chrf"])
    full = subprocess.run(args, capture_output=True, env=ENV, timeout=120)
    assert full.returncode == 0, full.stderr
    if prog == "nmt-generate":
        assert full.stdout == f["expected"]
    # Room for all but the last 2 bytes: the last write is short, and nothing after it fails.
    limit = len(full.stdout) - 2
    out = tmp_path / "out"
    with open(out, "wb") as stdout:
        r = subprocess.run(args, stdout=stdout, stderr=subprocess.PIPE, text=True, env=ENV,
                           timeout=120, preexec_fn=_file_size_limit(limit))
    error_line(prog, r.returncode, r.stderr, "<stdout>: cannot write (File too large)")
    assert out.read_bytes() == full.stdout[:limit]      # the right bytes, as far as they go


def test_unbuffered_and_buffered_stdout_write_the_same_bytes(f, tmp_path):
    # (Unbuffered into a pipe: the test above.)
    for unbuffered in (True, False):
        env = {k: v for k, v in ENV.items() if k != "PYTHONUNBUFFERED" or unbuffered}
        with open(tmp_path / "out", "wb") as stdout:
            r = subprocess.run([*GENERATE, f["ckpt"], "-i", f["in"]], stdout=stdout, env=env,
                               timeout=120)
        assert r.returncode == 0
        assert (tmp_path / "out").read_bytes() == f["expected"], unbuffered


class _Device(io.RawIOBase):
    """The lowest layer: takes at most ``room[0]`` bytes per call (None: 'would block' once),
    then whatever the next entry says; 0 is a device that takes nothing."""

    def __init__(self, room):
        self.room, self.data = list(room), b""

    def writable(self):
        return True

    def fileno(self):
        return sys.__stderr__.fileno()          # for select(): always writable

    def write(self, b):
        n = self.room.pop(0) if self.room else len(b)
        if n is None:
            return None
        self.data += bytes(b[:n])
        return min(n, len(b))


def test_write_all_loops_on_short_writes_and_stops_on_a_full_device():
    from nmt.io import write_all

    data = bytes(range(256)) * 40
    dev = _Device([1, 7, None, 100, 3000])
    write_all(dev, data)
    assert dev.data == data
    dev = _Device([10, 0])
    with pytest.raises(OSError) as e:
        write_all(dev, data)
    assert e.value.strerror == os.strerror(28) and dev.data == data[:10]     # ENOSPC


# --- jsonl ids ---------------------------------------------------------------------------------

def _check_ids(f, out_lines, lines):
    t = Translator.from_checkpoint(f["ckpt"], batch=BatchConfig(batch_size=64))
    objs = [json.loads(x) for x in out_lines]
    assert [o["id"] for o in objs] == list(range(len(lines)))
    assert [o["source"] for o in objs] == lines
    assert [o["translation"] for o in objs] == t.translate(lines)


def test_jsonl_ids_count_lines_across_stdin_batches(f):
    lines = f["lines"][:20]
    r = subprocess.run([*GENERATE, f["ckpt"], "--output-format", "jsonl", "--buffer-size", "3"],
                       input="".join(x + "\n" for x in lines), capture_output=True, text=True,
                       env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    _check_ids(f, r.stdout.splitlines(), lines)


@pytest.mark.parametrize("input_format", ["text", "jsonl"])
def test_jsonl_ids_count_lines_across_chunks_of_a_file(f, tmp_path, input_format):
    import nmt.cli.generate as generate

    lines = f["lines"][:11]
    src = tmp_path / "in"
    src.write_text("".join((json.dumps({"source": x}) if input_format == "jsonl" else x) + "\n"
                           for x in lines))
    res = CliRunner().invoke(generate.main, ["-q", f["ckpt"], "-i", str(src), "--input-format",
                                             input_format, "--output-format", "jsonl",
                                             "--buffer-size", "4"])
    assert res.exit_code == 0, (res.output, res.exception)
    _check_ids(f, res.stdout.splitlines(), lines)


# --- signals -----------------------------------------------------------------------------------

def _pending(fd):
    n = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, n)
    return n[0]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_a_signal_during_a_write_to_a_pipe_cuts_no_line(f, sig):
    # The translations (~5 KB, one write) do not fit in a 4 KB pipe that nobody reads: the
    # signal comes while nmt-generate is blocked in the middle of the write.
    p = subprocess.Popen([*GENERATE, f["ckpt"]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=ENV)
    try:
        fcntl.fcntl(p.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)
        p.stdin.write(Path(f["in"]).read_bytes())
        p.stdin.flush()                         # and stdin stays open: more could come
        deadline = time.time() + 60
        while _pending(p.stdout.fileno()) < 4096 and time.time() < deadline:
            time.sleep(0.01)
        assert len(f["expected"]) > 4096 and _pending(p.stdout.fileno()) == 4096
        time.sleep(0.2)
        p.send_signal(sig)
        time.sleep(0.3)
        out = p.stdout.read()
        p.wait(timeout=30)
    finally:
        p.kill()
    # Whole lines, the uninterrupted run's: here all of the batch that was being written.
    assert out == f["expected"]
    assert p.returncode == 128 + sig
    error_line("nmt-generate", p.returncode, p.stderr.read().decode(),
               f"interrupted by {signal.Signals(sig).name}")


def test_sigterm_with_output_removes_the_temporary_file(f, tmp_path):
    out = tmp_path / "out.txt"
    p = subprocess.Popen([*GENERATE, f["ckpt"], "-o", str(out), "--buffer-size", "5"],
                         stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    try:
        p.stdin.write("".join(x + "\n" for x in f["lines"][:5]).encode())
        p.stdin.flush()
        deadline = time.time() + 60
        tmps = []
        while time.time() < deadline:       # the first batch is in the temporary file
            tmps = [t for t in tmp_path.iterdir() if t.suffix == ".tmp" and t.stat().st_size]
            if tmps:
                break
            time.sleep(0.02)
        assert tmps
        time.sleep(0.2)                     # waiting for more input
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
    finally:
        p.kill()
    assert list(tmp_path.iterdir()) == []
    error_line("nmt-generate", p.returncode, p.stderr.read().decode(),
               "interrupted by SIGTERM", f"{out} not written")
    assert p.returncode == 143


# --- temporary directories of killed runs ------------------------------------------------------

def _preprocess(d, dest):
    return subprocess.run(["nmt-preprocess", "-s", "xx", "-t", "yy", "--trainpref",
                           str(d / "train"), "--destdir", str(dest), "--subword", "none",
                           "--joined-dictionary", "--workers", "1", "-q"],
                          capture_output=True, text=True, env=ENV, timeout=120)


def _tree(path):
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name != "meta.json"}


def test_a_rerun_removes_what_a_killed_preprocess_left(f, tmp_path):
    # The valid split is a pair of FIFOs (a training split may not be one: it is read twice):
    # nmt-preprocess stops in the middle, its temporary directory made, until it is killed.
    d = tmp_path
    for lang in ("xx", "yy"):
        (d / f"train.{lang}").write_text("\n".join(f["lines"][:40]) + "\n")
        os.mkfifo(d / f"valid.{lang}")
    p = subprocess.Popen(["nmt-preprocess", "-s", "xx", "-t", "yy", "--trainpref",
                          str(d / "train"), "--validpref", str(d / "valid"),
                          "--destdir", str(d / "bin"), "--subword", "none",
                          "--joined-dictionary", "--workers", "1", "-q"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    deadline = time.time() + 60
    while not [t for t in d.iterdir() if t.name.startswith(".bin.tmp-")] and \
            time.time() < deadline:
        time.sleep(0.02)
    p.kill()
    p.wait(timeout=30)
    (left,) = [t for t in d.iterdir() if t.name.startswith(".bin.tmp-")]
    assert f"-{p.pid}-" in left.name            # how a rerun knows whose it was
    # A live process's temporary directory of the same destination is not touched.
    sleeper = subprocess.Popen(["sleep", "60"])
    live = Path(str(left).replace(f"-{p.pid}-", f"-{sleeper.pid}-"))
    live.mkdir()
    try:
        for lang in ("xx", "yy"):
            os.unlink(d / f"valid.{lang}")
        r = _preprocess(d, d / "bin")
        assert r.returncode == 0, r.stderr
        assert [t.name for t in d.iterdir() if ".tmp-" in t.name] == [live.name]
    finally:
        sleeper.kill()
    clean = _preprocess(d, tmp_path / "clean" / "bin")
    assert clean.returncode == 0, clean.stderr
    assert _tree(d / "bin") == _tree(tmp_path / "clean" / "bin")


STALLING_EXPORT = """
import sys, time
import nmt.interop.ct2_export
def stall(*args, **kwargs):
    sys.stderr.write("NMT-TEST: stalled\\n")
    sys.stderr.flush()
    time.sleep(120)
nmt.interop.ct2_export.install_directory = stall
from nmt.cli.export import main
main()
"""


# The default run has the preprocess case; CI runs this one (.ci/run: -m slow).
@pytest.mark.slow        # 5-15 s
def test_a_rerun_removes_what_a_killed_export_left(f, tmp_path):
    pytest.importorskip("ctranslate2")
    p = subprocess.Popen([sys.executable, "-c", STALLING_EXPORT, f["ckpt"],
                          str(tmp_path / "ct2")], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        assert "NMT-TEST: stalled" in p.stderr.readline()
    finally:
        p.kill()
        p.wait(timeout=30)
    assert [t.name for t in tmp_path.iterdir()][0].startswith(".ct2.tmp-")
    for dest in (tmp_path / "ct2", tmp_path / "clean" / "ct2"):
        r = subprocess.run(["nmt-export", "-q", f["ckpt"], str(dest)], capture_output=True,
                           text=True, env=ENV, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout == f"{dest}\n"
    assert [t.name for t in tmp_path.iterdir() if ".tmp-" in t.name] == []
    assert _tree(tmp_path / "ct2") == _tree(tmp_path / "clean" / "ct2")


# --- small ones ----------------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["file", "stdin"])
def test_deeply_nested_jsonl_is_a_one_line_error_naming_the_line(f, tmp_path, where):
    text = '{"source": "a"}\n' + '{"source": ' + "[" * 100000 + "]" * 100000 + "}\n"
    args = [*GENERATE, f["ckpt"], "--input-format", "jsonl"]
    if where == "file":
        (tmp_path / "in.jsonl").write_text(text)
        args += ["-i", str(tmp_path / "in.jsonl")]
    r = subprocess.run(args, input=text if where == "stdin" else None, capture_output=True,
                       text=True, env=ENV, timeout=120)
    name = str(tmp_path / "in.jsonl") if where == "file" else "<stdin>"
    error_line("nmt-generate", r.returncode, r.stderr, f"{name}: line 2: JSON nested too deeply")


def test_score_reference_refuses_nbest(f, tmp_path):
    r = subprocess.run([*GENERATE, f["ckpt"], "-i", f["in"], "--score-reference",
                        "--reference", f["in"], "--nbest", "2", "--beam", "2"],
                       capture_output=True, text=True, env=ENV, timeout=120)
    error_line("nmt-generate", r.returncode, r.stderr, "--score-reference", "--nbest")
    assert r.returncode == 2 and r.stdout == ""


def test_export_accepts_generates_precision_names(f, tmp_path):
    pytest.importorskip("ctranslate2")
    for args, name in ((["--precision", "int8"], "p"), (["--quantization", "int8"], "q")):
        r = subprocess.run(["nmt-export", "-q", f["ckpt"], str(tmp_path / name), *args],
                           capture_output=True, text=True, env=ENV, timeout=120)
        assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "p" / "nmt_export.json").read_text())["quantization"] == "int8"
    assert _tree(tmp_path / "p") == _tree(tmp_path / "q")
    r = subprocess.run(["nmt-export", f["ckpt"], str(tmp_path / "x"), "--precision", "int8",
                        "--quantization", "float32"], capture_output=True, text=True, env=ENV,
                       timeout=120)
    error_line("nmt-export", r.returncode, r.stderr, "int8 and float32", "one weight type")
    assert r.returncode == 2 and not (tmp_path / "x").exists()


@pytest.mark.parametrize("tokenizer", ["spm", "flores200"])
def test_score_says_that_sacrebleu_could_not_download_its_tokenizer(f, tmp_path, tokenizer):
    # No network: an empty model directory and a proxy that refuses every connection.
    env = {k: v for k, v in ENV.items() if k.lower() not in ("no_proxy", "http_proxy",
                                                             "https_proxy", "all_proxy")}
    env.update(SACREBLEU=str(tmp_path), https_proxy="http://127.0.0.1:9",
               http_proxy="http://127.0.0.1:9")
    r = subprocess.run(["nmt-score", "--ref", f["in"], "--hyp", f["in"], "-tok", tokenizer],
                       capture_output=True, text=True, env=env, timeout=120)
    error_line("nmt-score", r.returncode, r.stderr,
               f"--tokenize {tokenizer}: sacreBLEU needs to download its model",
               str(tmp_path / "models"), "could not (")
    assert "URLError" not in r.stderr and r.stdout == ""
