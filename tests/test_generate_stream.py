"""nmt-generate -i FILE reads the file a chunk at a time: its memory does not grow
with the input, and its output is that of the same lines through stdin."""

from __future__ import annotations

import os
import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from test_translator import make_checkpoint, mixed_lines

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_preprocess import TreeRss  # noqa: E402
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
GENERATE = [sys.executable, "-m", "nmt.cli.generate", "-q", "--threads", "1", "--beam", "1"]


def _peak_rss_mb(cmd: list[str]) -> float:
    """Peak RSS of the process that runs ``cmd``, sampled (wait4's ru_maxrss would count the
    pages of this test process, which the child shares between fork and exec)."""
    proc = psutil.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    with TreeRss(proc.pid, interval=0.01) as rss:
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err.decode()
    return rss.peak / 2**20


def test_memory_does_not_grow_with_the_input_file(tmp_path):
    ckpt = make_checkpoint(tmp_path / "c.pt")
    # Long lines that cost nothing to translate (blank but for a word in one of 40): the
    # input's size, not the model's work, is what grows. 10x is 40 MiB.
    pad = " " * 10000
    block = "".join(("w1 w2" if i % 40 == 0 else "") + pad + "\n" for i in range(400))
    peaks = []
    for times in (1, 10):
        src = tmp_path / f"in{times}"
        src.write_text(block * times)
        peaks.append(_peak_rss_mb([*GENERATE, str(ckpt), "-i", str(src), "-o",
                                   str(tmp_path / "out"), "--buffer-size", "200"]))
        assert (tmp_path / "out").read_text().count("\n") == 400 * times
    assert peaks[1] - peaks[0] < 12, f"peak RSS {peaks[0]:.0f} -> {peaks[1]:.0f} MiB"


def test_a_file_in_chunks_translates_as_stdin_and_bad_input_writes_nothing(tmp_path):
    ckpt = make_checkpoint(tmp_path / "c.pt")
    lines = mixed_lines(45, seed=5)
    src = tmp_path / "in"
    src.write_text("".join(x + "\n" for x in lines))
    piped = subprocess.run([*GENERATE, str(ckpt)], input=src.read_bytes(), capture_output=True,
                           env=ENV, timeout=120)
    assert piped.returncode == 0, piped.stderr
    for buffer in ("7", "10000"):
        r = subprocess.run([*GENERATE, str(ckpt), "-i", str(src), "--buffer-size", buffer],
                           capture_output=True, env=ENV, timeout=120)
        assert r.returncode == 0, r.stderr
        assert r.stdout == piped.stdout
    # Bad UTF-8 in the last chunk: found by the first pass, before any chunk is written.
    src.write_bytes(src.read_bytes() + b"w1 \xff\n")
    r = subprocess.run([*GENERATE, str(ckpt), "-i", str(src), "--buffer-size", "7"],
                       capture_output=True, env=ENV, timeout=120)
    assert r.returncode == 1 and r.stdout == b""
    assert r.stderr.decode().strip() == (f"nmt-generate: error: {src}: line 46: invalid UTF-8 "
                                         f"at byte 3")


@pytest.mark.slow        # a benchmark's quick mode, 5-12 s; CI runs it (.ci/run: -m slow)
def test_bench_generate_memory_quick(tmp_path):
    ckpt = make_checkpoint(tmp_path / "c.pt")
    src = tmp_path / "in"
    src.write_text("".join(x + "\n" for x in mixed_lines(100, seed=6)))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_generate_memory.py"),
                           str(ckpt), "--input", str(src), "--quick", "--json",
                           str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=ENV)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| in x")]
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
    assert [c[1] for c in cells] == ["100", "200"]
    assert all(float(c[5]) > 10 for c in cells)         # MiB of a real Python process


@pytest.mark.slow        # a benchmark's quick mode, 5-12 s; CI runs it (.ci/run: -m slow)
def test_bench_generate_resume_quick(tmp_path):
    """The 1M-line benchmark's machinery on 3,000 lines: a real SIGKILL mid-run, a resumed
    rerun that says where it resumed, and a byte-for-byte check against the 1x output."""
    ckpt = make_checkpoint(tmp_path / "c.pt")
    src = tmp_path / "in"
    src.write_text("".join(x + "\n" for x in mixed_lines(100, seed=7)))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_generate_resume.py"),
                           str(ckpt), "--input", str(src), "--quick", "--threads", "1",
                           "--json", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=180, cwd=ROOT, env=ENV)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["lines"] == 3000 and r["identical"] and r["resume_logged"]
    assert 0 < r["killed_after"] < 3000
