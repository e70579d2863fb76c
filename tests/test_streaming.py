"""nmt-generate reading a pipe: a program that writes one line and waits for its translation
gets it, and a file piped in is still translated whole and in order."""

from __future__ import annotations

import os
import select
import subprocess
import sys

from nmt.search.translator import Translator
from test_translator import make_checkpoint, mixed_lines


def read_line(stream, timeout=60.0) -> str:
    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, "no translation came back: the input was not translated as it arrived"
    return stream.readline().decode("utf-8")


def test_a_caller_gets_each_answer_before_writing_the_next_line(tmp_path):
    ckpt = make_checkpoint(tmp_path / "c.pt")
    want = Translator.from_checkpoint(ckpt).translate(["w1 w2 w3", "w4", "", "w5 w6"])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "nmt.cli.generate", str(ckpt), "-q",
                             "--threads", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    try:
        for line, expected in zip(["w1 w2 w3", "w4", "", "w5 w6"], want):
            proc.stdin.write((line + "\n").encode())
            proc.stdin.flush()
            assert read_line(proc.stdout) == expected + "\n"
        proc.stdin.write(b"w4")                   # a last line without a newline counts
        proc.stdin.close()
        assert read_line(proc.stdout) == want[1] + "\n"
        assert proc.wait(timeout=60) == 0
        assert proc.stdout.read() == b""
    finally:
        proc.kill()


def test_piped_file_in_small_buffers_is_translated_whole_and_in_order(tmp_path):
    ckpt = make_checkpoint(tmp_path / "c.pt")
    lines = mixed_lines(50, seed=4)
    want = Translator.from_checkpoint(ckpt).translate(lines)
    data = "".join(x + "\n" for x in lines).encode()
    for buffer in ("1", "7", "10000"):
        r = subprocess.run([sys.executable, "-m", "nmt.cli.generate", str(ckpt), "-q",
                            "--threads", "1", "--buffer-size", buffer], input=data,
                           capture_output=True, timeout=120,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert r.returncode == 0, r.stderr
        assert r.stdout.decode().split("\n")[:-1] == want
    bad = subprocess.run([sys.executable, "-m", "nmt.cli.generate", str(ckpt), "--buffer-size",
                          "0"], input=b"w1\n", capture_output=True, timeout=60)
    assert bad.returncode == 2 and bad.stdout == b""
    assert bad.stderr.decode().strip() == ("nmt-generate: error: --buffer-size must be >= 1, "
                                           "got 0")
