"""nmt-generate through its CLI: files, stdin, jsonl, n-best, the pipeline mode, bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from nmt.cli.generate import main
from nmt.search.translator import Translator
from nmt.checkpoint import save_checkpoint

from test_translator import make_checkpoint, mixed_lines


def write(path, lines):
    path.write_bytes("".join(line + "\n" for line in lines).encode("utf-8"))
    return path


def run(args, stdin=None, ok=True):
    res = CliRunner().invoke(main, ["-q", "--device", "cpu", *map(str, args)], input=stdin)
    if ok:
        assert res.exit_code == 0, (res.output, res.stderr, res.exception)
    return res


def one_line_error(res, *needles):
    assert res.exit_code != 0
    err = res.stderr.strip()
    assert err.startswith("nmt-generate: error:") and "\n" not in err, err
    assert "Traceback" not in res.output + res.stderr
    for n in needles:
        assert n in err, err


def test_file_stdin_and_output_file_agree(ckpt, tmp_path):
    lines = mixed_lines(25, seed=2)
    src = write(tmp_path / "in.txt", lines)
    want = Translator.from_checkpoint(ckpt).translate(lines)
    out = run([ckpt, "--input", src]).stdout.split("\n")
    assert out[:-1] == want and out[-1] == ""
    assert run([ckpt], stdin=src.read_bytes()).stdout == "\n".join(want) + "\n"
    run([ckpt, "-i", src, "-o", tmp_path / "out.txt", "--batch-size", "3"])
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "\n".join(want) + "\n"
    assert not [p for p in tmp_path.iterdir()          # no temp file left (the record stays)
                if p.name.startswith(".") and not p.name.endswith(".nmt-written")]


def test_jsonl_and_nbest(ckpt, tmp_path):
    lines = ["w1 w2 w3", "", "w7"]
    src = write(tmp_path / "in.txt", lines)
    rows = [json.loads(x) for x in run([ckpt, "-i", src, "--output-format", "jsonl",
                                        "--nbest", "2"]).stdout.splitlines()]
    assert [r["id"] for r in rows] == [0, 1, 2]
    assert [r["source"] for r in rows] == lines
    assert rows[1]["translation"] == "" and rows[1]["score"] is None
    assert len(rows[0]["nbest"]) == 2 and rows[0]["tokens"][-1] == "</s>"
    assert len(rows[0]["token_scores"]) == len(rows[0]["tokens"])
    text = run([ckpt, "-i", src, "--nbest", "3"]).stdout.split("\n")[:-1]
    assert len(text) == 3 * len(lines) and text[3:6] == ["", "", ""]
    assert text[0] == rows[0]["translation"]


def test_options_reach_the_search(ckpt, tmp_path):
    src = write(tmp_path / "in.txt", ["w1 w2 w3 w4"])
    out = run([ckpt, "-i", src, "--beam", "1", "--max-len-a", "0", "--max-len-b", "2",
               "--threads", "1", "--max-tokens", "50"]).stdout
    assert len(out.split()) <= 2
    res = run([ckpt, "-i", src, "--nbest", "5", "--beam", "2"], ok=False)
    one_line_error(res, "nbest")
    one_line_error(run([ckpt, "-i", src, "--precision", "fp16"], ok=False), "GPU")


def test_bad_checkpoints(tmp_path):
    src = write(tmp_path / "in.txt", ["w1"])
    one_line_error(run([tmp_path / "missing.pt", "-i", src], ok=False), "no such checkpoint")
    (tmp_path / "corrupt.pt").write_bytes(b"PK\x03\x04 this is not a checkpoint" * 10)
    one_line_error(run([tmp_path / "corrupt.pt", "-i", src], ok=False), "corrupt.pt")
    save_checkpoint({"format_version": 99, "model": {"w": torch.zeros(1)}},
                    tmp_path / "future.pt")
    one_line_error(run([tmp_path / "future.pt", "-i", src], ok=False), "format_version 99")


def test_bad_input(ckpt, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"w1 w2\nw3 \xff\xfe w4\n")
    one_line_error(run([ckpt, "-i", bad], ok=False), "bad.txt", "line 2", "UTF-8")
    one_line_error(run([ckpt], stdin=b"w1\n\xc3\n", ok=False), "<stdin>", "line 2")
    one_line_error(run([ckpt, "-i", tmp_path / "nope.txt"], ok=False), "nope.txt")
    res = run([ckpt, "-i", bad, "-o", tmp_path / "out.txt"], ok=False)
    one_line_error(res, "bad.txt", "line 2", "UTF-8")
    assert res.stdout == "" and not (tmp_path / "out.txt").exists()


def test_pipeline_mode_translates_the_test_split(tmp_path):
    """`... | nmt-train | nmt-generate`: stdin's first line is the checkpoint; its data
    directory's test split is translated."""
    from nmt.cli.preprocess import main as preprocess
    from nmt.data import DataDir

    words = [f"w{i}" for i in range(12)]
    train = [" ".join(words[(i + j) % 12] for j in range(1 + i % 5)) for i in range(40)]
    test = ["w1 w2", "w3", "w4 w5 w6 w7", "w0"]
    for lang in ("xx", "yy"):
        write(tmp_path / f"train.{lang}", train)
        write(tmp_path / f"test.{lang}", test)
    res = CliRunner().invoke(preprocess, [
        "-q", "--workers", "1", "-s", "xx", "-t", "yy", "--trainpref", str(tmp_path / "train"),
        "--testpref", str(tmp_path / "test"), "--subword", "none", "--joined-dictionary",
        "--destdir", str(tmp_path / "data")])
    assert res.exit_code == 0, res.output
    dd = DataDir.open(tmp_path / "data")
    path = make_checkpoint(tmp_path / "ck.pt", codec=dd.src_codec,
                           data_dir=str(tmp_path / "data"))
    out = run([], stdin=f"{path}\n".encode()).stdout
    assert out.split("\n")[:-1] == Translator.from_checkpoint(path).translate(test)
    # --input FILE instead of the split
    other = write(tmp_path / "other.txt", ["w9 w8"])
    assert run(["-i", other], stdin=f"{path}\n".encode()).stdout.count("\n") == 1
    one_line_error(run(["--split", "valid"], stdin=f"{path}\n".encode(), ok=False), "valid")
    one_line_error(run([], stdin=b"", ok=False), "checkpoint")


def test_console_script(ckpt, tmp_path):
    """The installed entry point, as a user runs it."""
    src = write(tmp_path / "in.txt", ["w1 w2", "", "w3"])
    proc = subprocess.run([sys.executable, "-m", "nmt.cli.generate", str(ckpt), "-i", str(src),
                           "--threads", "1"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 3 and proc.stdout.split("\n")[1] == ""
    assert "sentences/s" in proc.stderr           # the summary line


def run_quick_benchmark(name: str, tmp_path, *args) -> tuple[str, dict]:
    """benchmarks/NAME --quick --threads 1 ARGS: its stdout and its --json report."""
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / "benchmarks" / name
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(script), "--quick", "--threads", "1", *args,
                           "--json", str(out)], capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, json.loads(out.read_text())


def test_benchmark_quick_mode(tmp_path):
    """benchmarks/bench_generate.py --quick runs end to end and reports what it promises."""
    stdout, rep = run_quick_benchmark("bench_generate.py", tmp_path, "--beams", "1,2")
    assert "sentences/s" in stdout and "peak RSS" in stdout
    for beam in ("1", "2"):
        row = rep["beams"][beam]
        assert row["sentences_per_s"] > 0 and row["target_tokens"] > 0
        assert row["ms_per_sentence_by_source_length"]
