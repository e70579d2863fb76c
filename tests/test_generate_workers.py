"""nmt-generate --workers N: N decoding processes whose output, merged in input
order, is byte for byte the one-process output (beam and sampling); with --output it resumes
after a kill -9 like one process; a worker that dies is a one-line error, and its lines are
resumed by a rerun. Real processes throughout."""

from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from test_reliability_output import error_line
from test_translator import checkpoint_and_input

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
GENERATE = [sys.executable, "-m", "nmt.cli.generate", "--threads", "1", "--buffer-size", "15"]


@pytest.fixture(scope="module")
def f(tmp_path_factory):
    return checkpoint_and_input(tmp_path_factory, "workers", 200, 8)


def _run(f, *extra, ok=True):
    r = subprocess.run([*GENERATE, f["ckpt"], "-i", f["in"], *extra], capture_output=True,
                       env=ENV, timeout=180)
    if ok:
        assert r.returncode == 0, r.stderr.decode()
    return r


# The default run keeps beam search; the slow run also samples.
@pytest.mark.parametrize("extra", [("--output-format", "jsonl"),
                                   pytest.param(("--sampling", "--seed", "3", "--nbest", "2"),
                                                marks=pytest.mark.slow)],
                         ids=["beam-jsonl", "sampling"])
def test_two_workers_write_the_one_process_output(f, extra):
    one = _run(f, "-q", *extra).stdout
    two = _run(f, "-v", "--workers", "2", *extra)
    assert two.stdout == one
    assert two.stdout.count(b"\n") == 200 * (2 if "--nbest" in extra else 1)
    # ... and two worker processes translated it between them, every line once
    done = re.findall(r"worker (\d+): lines (\d+)-(\d+) translated", two.stderr.decode())
    assert len({pid for pid, _, _ in done}) == 2, two.stderr.decode()[-2000:]
    assert sorted(n for _, a, b in done for n in range(int(a), int(b) + 1)) == \
        list(range(1, 201))


def _wait_for_journal(out, lines, proc):
    journal = out.with_name(out.name + ".nmt-progress.json")
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        try:
            if json.loads(journal.read_text())["input_lines"] >= lines:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.005)
    raise AssertionError("the run ended before it could be stopped")


def _workers_of(proc):
    """The worker processes (not multiprocessing's resource tracker), in start order."""
    kids = [k for k in psutil.Process(proc.pid).children()
            if any("spawn_main" in a for a in k.cmdline())]
    assert len(kids) == 2, kids
    return sorted(kids, key=lambda k: k.pid)


@pytest.mark.slow        # 10-30 s; CI runs it (.ci/run: -m slow)
def test_killed_workers_run_resumes_to_the_one_process_output(f, tmp_path):
    want = _run(f, "-q").stdout
    out = tmp_path / "out.txt"
    cmd = [*GENERATE, f["ckpt"], "-i", f["in"], "-o", str(out), "-q", "--workers", "2"]
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, env=ENV)
    try:
        _wait_for_journal(out, 30, p)
        workers = psutil.Process(p.pid).children()      # the tracker too
        translating = _workers_of(p)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        # The orphaned workers end at once (the kernel kills them with their parent; they
        # translated their chunk on for seconds), and the tracker after them.
        gone, alive = psutil.wait_procs(translating, timeout=2)
        assert alive == []
        gone, alive = psutil.wait_procs(workers, timeout=30)
        assert alive == []
    finally:
        p.kill()
    # A worker that dies: one line, and what is done stays for the rerun.
    p = subprocess.Popen(cmd, stderr=subprocess.PIPE, env=ENV)
    try:
        _wait_for_journal(out, 60, p)
        _workers_of(p)[1].kill()
        p.wait(timeout=60)
    finally:
        p.kill()
    error_line("nmt-generate", p.returncode, p.stderr.read().decode(),
               "nmt-generate-worker-", "stopped (exit code -9) before finishing its lines",
               "lines are done; rerun the same command to resume")
    r = subprocess.run(cmd, capture_output=True, env=ENV, timeout=180)
    assert r.returncode == 0, r.stderr.decode()
    assert out.read_bytes() == want
    assert sorted(x.name for x in tmp_path.iterdir()
                  if not x.name.endswith(".nmt-written")) == ["out.txt"]


def test_bad_worker_counts_are_refused_and_0_means_one_per_cpu(f):
    r = _run(f, "--workers", "-1", ok=False)
    error_line("nmt-generate", r.returncode, r.stderr.decode(),
               "--workers must be >= 0 (0: one per CPU), got -1")
    assert r.returncode == 2 and r.stdout == b""
    # 0: as many workers as this process may use CPUs (as nmt-preprocess --workers 0)
    from nmt.runtime import usable_cpus

    r = _run(f, "--workers", "0")
    n = usable_cpus()
    assert (f"{n} workers x 1 thread(s)" in r.stderr.decode()) == (n > 1), r.stderr.decode()
    assert r.stdout == _run(f, "-q").stdout


@pytest.mark.slow        # ~9 s; CI runs it (.ci/run: -m slow)
def test_workers_answer_a_stream_line_by_line(f, tmp_path):
    """A caller that writes one line to stdin and waits gets its translation while stdin
    stays open, as with one process (the workers must not wait for more input first)."""
    import select

    lines = ["w1 w2 w3", "w4 w5", "w6"]
    src = tmp_path / "three.txt"
    src.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    want = subprocess.run([*GENERATE, f["ckpt"], "-i", src, "-q"], capture_output=True,
                          env=ENV, text=True, timeout=120).stdout.splitlines()
    p = subprocess.Popen([*GENERATE, f["ckpt"], "--workers", "2", "-q"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, text=True,
                         bufsize=1)
    try:
        got = []
        for line in lines:
            p.stdin.write(line + "\n")
            p.stdin.flush()
            ready, _, _ = select.select([p.stdout], [], [], 60)
            assert ready, f"no answer to {line!r} within 60 s while stdin stays open"
            got.append(p.stdout.readline().rstrip("\n"))
        p.stdin.close()
        assert p.wait(60) == 0, p.stderr.read()
    finally:
        p.kill()
    assert got == want
