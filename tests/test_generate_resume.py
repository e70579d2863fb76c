"""nmt-generate --output FILE -i INPUT resumes: real processes killed with SIGKILL or
SIGTERM, or stopped by a file size limit (a full disk), then rerun; the finished file is
compared byte for byte with an uninterrupted run's. A rerun that differs is refused with one
line naming the difference; --overwrite starts afresh."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from test_reliability_output import _file_size_limit, error_line
from test_translator import checkpoint_and_input, make_checkpoint

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
GENERATE = [sys.executable, "-m", "nmt.cli.generate", "--threads", "1", "--buffer-size", "20"]


@pytest.fixture(scope="module")
def f(tmp_path_factory):
    return checkpoint_and_input(tmp_path_factory, "resume", 300, 7)


def _run(f, out, *extra, ok=True, **kw):
    r = subprocess.run([*GENERATE, f["ckpt"], "-i", f["in"], "-o", str(out), *extra],
                       capture_output=True, text=True, env=ENV, timeout=180, **kw)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def _reference(f, *extra) -> bytes:
    """An uninterrupted run's output (cached per options)."""
    out = f["dir"] / ("ref" + "_".join(extra).replace("-", ""))
    if not out.exists():
        _run(f, out, "-q", *extra)
    return out.read_bytes()


def _journal(out):
    return out.with_name(out.name + ".nmt-progress.json")


def _partial(out):
    return out.with_name(out.name + ".nmt-partial")


def _stop_after(f, out, lines: int, sig, *extra) -> int:
    """Start a run, send ``sig`` once its journal records at least ``lines`` lines, wait for
    it to end; the lines the journal records then."""
    p = subprocess.Popen([*GENERATE, f["ckpt"], "-i", f["in"], "-o", str(out), "-q", *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    try:
        deadline, done = time.time() + 120, 0
        while time.time() < deadline and p.poll() is None:
            try:
                done = json.loads(_journal(out).read_text())["input_lines"]
            except (OSError, ValueError):
                done = 0
            if done >= lines:
                break
            time.sleep(0.005)
        assert p.poll() is None, "the run ended before it could be stopped"
        p.send_signal(sig)
        p.wait(timeout=60)
        f["stderr"] = p.stderr.read().decode()
    finally:
        p.kill()
    f["returncode"] = p.returncode
    assert p.returncode == (-sig if sig == signal.SIGKILL else 128 + sig)
    return json.loads(_journal(out).read_text())["input_lines"]


# The default run keeps beam search; the slow run also samples.
@pytest.mark.parametrize("extra", [(), pytest.param(("--sampling", "--seed", "5", "--nbest", "2"),
                                                   marks=pytest.mark.slow)],
                         ids=["beam", "sampling"])
def test_killed_twice_then_rerun_gives_the_uninterrupted_bytes(f, tmp_path, extra):
    want = _reference(f, *extra)
    out = tmp_path / "out.txt"
    first = _stop_after(f, out, 40, signal.SIGKILL, *extra)
    assert 40 <= first < 300 and first % 20 == 0
    # Bytes past the journal's count (a chunk cut by the kill; here more than the rest of
    # the output) are not part of the output.
    with open(_partial(out), "ab") as p:
        p.write(b"cut\n" * len(want))
    second = _stop_after(f, out, first + 60, signal.SIGKILL, *extra)
    assert second >= first + 60
    # A kill during a journal update leaves atomic_write's temporary: the rerun removes it.
    (tmp_path / f".{_journal(out).name}.x1y2z3.tmp").write_text("{")
    r = _run(f, out, *extra)
    assert f"resuming {out} after input line {second}" in r.stderr
    assert out.read_bytes() == want
    assert sorted(p.name for p in tmp_path.iterdir()
                  if not p.name.endswith(".nmt-written")) == ["out.txt"]


def test_sigterm_then_rerun_and_a_full_disk_then_rerun(f, tmp_path):
    want = _reference(f)
    out = tmp_path / "out.txt"
    done = _stop_after(f, out, 60, signal.SIGTERM)
    assert f["returncode"] == 143
    error_line("nmt-generate", f["returncode"], f["stderr"], "interrupted by SIGTERM",
               f"{out}: the first {done} lines are done; rerun the same command to resume")
    assert not out.exists() and _partial(out).exists()
    # The disk fills up half way through: the error says what a rerun does.
    r = _run(f, out, "-q", ok=False, preexec_fn=_file_size_limit(len(want) // 2))
    error_line("nmt-generate", r.returncode, r.stderr, f"{out}: cannot write (File too large)",
               "lines are done; rerun the same command to resume")
    assert not out.exists() and json.loads(_journal(out).read_text())["input_lines"] > done
    _run(f, out, "-q")
    assert out.read_bytes() == want
    assert not _journal(out).exists() and not _partial(out).exists()


@pytest.mark.slow        # 10-30 s; CI runs it (.ci/run: -m slow)
def test_a_rerun_that_differs_is_refused_and_overwrite_starts_afresh(f, tmp_path):
    out = tmp_path / "out.txt"
    _stop_after(f, out, 20, signal.SIGKILL)
    journal = _journal(out).read_bytes()
    other = tmp_path / "other.pt"
    make_checkpoint(other, seed=1)
    moved = tmp_path / "in.txt"
    moved.write_bytes(open(f["in"], "rb").read())
    for extra, named in [(("--beam", "2"), "with --beam unset (now 2)"),
                         (("--sampling",), "with no --sampling (now --sampling)")]:
        r = _run(f, out, *extra, ok=False)
        error_line("nmt-generate", r.returncode, r.stderr, named, "rerun that command to "
                   "resume it, or add --overwrite to start afresh")
    r = subprocess.run([*GENERATE, str(other), "-i", f["in"], "-o", str(out)],
                       capture_output=True, text=True, env=ENV, timeout=60)
    error_line("nmt-generate", r.returncode, r.stderr, f"checkpoint {f['ckpt']} (now {other})")
    r = subprocess.run([*GENERATE, f["ckpt"], "-i", str(moved), "-o", str(out)],
                       capture_output=True, text=True, env=ENV, timeout=60)
    error_line("nmt-generate", r.returncode, r.stderr, f"input {f['in']} (now {moved})")
    assert _journal(out).read_bytes() == journal and not out.exists()
    _run(f, out, "-q", "--beam", "2", "--overwrite")
    assert out.read_bytes() == _reference(f, "--beam", "2")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.txt.nmt-written", "in.txt",
                                                          "other.pt", "out.txt"]


def test_a_changed_input_file_is_refused(f, tmp_path):
    src = tmp_path / "in.txt"
    src.write_bytes(open(f["in"], "rb").read())
    out = tmp_path / "out.txt"
    g = {**f, "in": str(src)}
    _stop_after(g, out, 20, signal.SIGKILL)
    with open(src, "a") as s:
        s.write("w1 w2\n")
    r = _run(g, out, ok=False)
    error_line("nmt-generate", r.returncode, r.stderr,
               f"with {src} as it was then (it has changed since")


def test_a_second_run_writing_the_same_output_is_refused_while_the_first_runs(f, tmp_path):
    """Two runs of one command on one --output would resume the same journal and write their
    chunks over each other in one partial file. The second is refused, naming the first;
    the first finishes with the uninterrupted output and leaves no lock file."""
    out = tmp_path / "out.txt"
    first = subprocess.Popen([*GENERATE, f["ckpt"], "-i", f["in"], "-o", str(out), "-q"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    try:
        deadline = time.time() + 120
        while not _journal(out).exists() and first.poll() is None and time.time() < deadline:
            time.sleep(0.02)
        first.send_signal(signal.SIGSTOP)       # holds its output, mid-run
        assert first.poll() is None and _journal(out).exists()
        second = _run(f, out, "-q", ok=False)
        error_line("nmt-generate", second.returncode, second.stderr,
                   "in use by another nmt-generate", f"pid {first.pid}")
        first.send_signal(signal.SIGCONT)
        assert first.wait(timeout=180) == 0, first.stderr.read().decode()
    finally:
        first.kill()
        first.wait()
    assert out.read_bytes() == _reference(f)
    assert not list(tmp_path.glob(".out.txt.nmt-lock")) and not _journal(out).exists()


def test_a_signal_while_the_output_is_installed_finishes_it_and_exits_0(f, tmp_path,
                                                                       monkeypatch):
    """SIGTERM between the rename of OUT.nmt-partial to OUT and the journal's removal: both
    happen, and the run, its output whole, exits 0 with a warning. (It exited 143 saying
    "the first N lines are done; rerun to resume", left the journal, and the rerun
    translated everything again.)"""
    from click.testing import CliRunner

    import nmt.batch.resumable as R
    from nmt.cli.generate import main as generate_main

    real = R.fsync_dir

    def fsync_then_signal(path):
        real(path)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(R, "fsync_dir", fsync_then_signal)
    out = tmp_path / "out.txt"
    r = CliRunner().invoke(generate_main, [f["ckpt"], "-i", f["in"], "-o", str(out),
                                           "--threads", "1", "--buffer-size", "20", "-q"])
    assert r.exit_code == 0, r.output
    assert "SIGTERM came once" in r.output and "written in full" in r.output
    assert out.read_bytes() == _reference(f)
    assert not _journal(out).exists() and not _partial(out).exists()


def test_a_signal_while_the_output_is_installed_reports_what_is_on_disk(tmp_path, monkeypatch):
    """The same at the level of the output: what the stop reports is what is on disk."""
    import nmt.batch.resumable as R
    from nmt.signals import Interrupted, stop_on_signals

    real = R.fsync_dir

    def fsync_then_signal(path):
        real(path)
        os.kill(os.getpid(), signal.SIGTERM)

    out_path = tmp_path / "out.txt"
    src = tmp_path / "in.txt"
    src.write_text("src1\n")                   # one line of 5 bytes: commit(1, 5) below
    out = R.ResumableOutput(out_path, {"input": {"path": str(src)},
                                       "options": {"output_format": "text", "nbest": 1}})
    with pytest.raises(Interrupted):
        with stop_on_signals():
            with out:
                out.writer.write("eins")
                out.commit(1, 5)
                monkeypatch.setattr(R, "fsync_dir", fsync_then_signal)
    assert out_path.read_text() == "eins\n"
    assert not _journal(out_path).exists() and not _partial(out_path).exists()
    assert out.stopped() == f"{out_path} was written in full"


# --- a journal that does not match what is on disk -----------------------------------------

def _tamper(path, **changes):
    state = json.loads(path.read_text())
    state.update(changes)
    path.write_text(json.dumps(state))
    return state


# The default run keeps a tampered journal and an edited input; the slow run has them all.
@pytest.mark.parametrize("change", [pytest.param(c, marks=pytest.mark.slow)
                                    for c in ("skip", "repeat", "huge")]
                         + ["edited input", "identity"])
def test_a_journal_that_disagrees_is_refused(f, tmp_path, change):
    """Lines skipped or repeated, input_lines 10^9 with output_bytes 0, an input edited in
    place with its size and modification time restored: each gave a wrong file with exit 0;
    now the rerun is refused in one line, and --overwrite gives the right file."""
    src = tmp_path / "in.txt"
    src.write_bytes(open(f["in"], "rb").read())
    g = {**f, "in": str(src)}
    out = tmp_path / "out.txt"
    _stop_after(g, out, 60, signal.SIGKILL)
    state = json.loads(_journal(out).read_text())
    if change == "skip":            # the journal claims a later chunk than the partial holds
        data = src.read_bytes()
        extra = data[state["input_bytes"]:].split(b"\n", 20)
        _tamper(_journal(out), input_lines=state["input_lines"] + 20,
                input_bytes=state["input_bytes"] + sum(len(x) + 1 for x in extra[:20]))
    elif change == "repeat":        # the journal claims an earlier position than the partial
        _tamper(_journal(out), input_lines=state["input_lines"] - 20)
    elif change == "huge":
        _tamper(_journal(out), input_lines=10**9, output_bytes=0, output_lines=0)
    elif change == "identity":      # was an internal error
        _tamper(_journal(out), identity={"options": "garbage"})
    else:                           # a word of a translated line changed, size and time kept
        st = os.stat(src)
        data = bytearray(src.read_bytes())
        i = data.index(b" ")
        data[i - 1:i] = b"Z" if data[i - 1:i] != b"Z" else b"Y"
        src.write_bytes(bytes(data))
        os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = _run(g, out, "-q", ok=False)
    error_line("nmt-generate", r.returncode, r.stderr, "--overwrite")
    assert not out.exists()
    r = _run(g, out, "-q", "--overwrite")
    want = _run(g, tmp_path / "fresh.txt", "-q").returncode == 0 and \
        (tmp_path / "fresh.txt").read_bytes()
    assert out.read_bytes() == want
    assert len(want.splitlines()) == len(src.read_bytes().splitlines())


@pytest.mark.slow        # 10-30 s; CI runs it (.ci/run: -m slow)
def test_another_buffer_size_resumes_unless_the_output_depends_on_it(f, tmp_path):
    """--buffer-size changes beam search's output nowhere: a resume with another one goes on
    (it was refused); with sampling, whose draws follow the chunks, it is still refused."""
    out = tmp_path / "out.txt"
    _stop_after(f, out, 20, signal.SIGKILL)
    _run(f, out, "-q", "--buffer-size", "7")
    assert out.read_bytes() == _reference(f)
    out = tmp_path / "sampled.txt"
    _stop_after(f, out, 20, signal.SIGKILL, "--sampling", "--seed", "5")
    r = _run(f, out, "--sampling", "--seed", "5", "--buffer-size", "10", ok=False)
    error_line("nmt-generate", r.returncode, r.stderr, "with --buffer-size 20 (now 10)")
